package workflow_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// A parent that ends without collecting a child's outcome (it completes,
// fails, or fails and compensates) cancels that child in the transaction
// that records its end: the child, waiting on a signal, ends cancelled and
// its own compensation runs, as for Cancel.
func TestParentEndCancelsUncollectedChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var unreserved, refunded atomic.Int32
	child := workflow.MustRegister(b.reg, "orphan", func(wctx workflow.Context, _ int) (int, error) {
		if _, err := workflow.Step(wctx, "reserve", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "unreserve", func(ctx context.Context) error { unreserved.Add(1); return nil })
		_, _, err := workflow.WaitSignal[int](wctx, "never", 0)
		return 0, err
	})
	parent := func(end string) *workflow.Workflow[int, int] {
		return workflow.MustRegister(b.reg, "parent-"+end, func(wctx workflow.Context, _ int) (int, error) {
			workflow.Child(wctx, "c", child, 0, nil)
			if end == "compensates" {
				if _, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
					return 0, err
				}
				workflow.Compensate(wctx, "refund", func(ctx context.Context) error { refunded.Add(1); return nil })
			}
			// Ends once the child waits, so that its compensation is due.
			if _, _, err := workflow.WaitSignal[int](wctx, "end", 0); err != nil {
				return 0, err
			}
			if end == "completes" {
				return 1, nil // returns without Get
			}
			return 0, errors.New("parent gives up")
		})
	}
	ends := map[string]error{"completes": nil, "fails": workflow.ErrRunFailed, "compensates": workflow.ErrRunCompensated}
	wfs := map[string]*workflow.Workflow[int, int]{}
	for end := range ends {
		wfs[end] = parent(end)
	}
	b.start()
	for end, want := range ends {
		h, err := workflow.Start(ctx, b.pool, wfs[end], 0, &workflow.StartOpts{ID: end})
		if err != nil {
			t.Fatal(err)
		}
		b.waitFor(end+": child waiting", func() bool {
			return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'signal:never#1' AND state = 'waiting'`, h.ID+"/c") == 1
		})
		if err := workflow.Signal(ctx, b.pool, h.ID, "end", 0); err != nil {
			t.Fatal(err)
		}
		if _, err := result[int](t, b.pool, h.ID); (want == nil && err != nil) || (want != nil && !errors.Is(err, want)) {
			t.Fatalf("%s: parent: want %v, got %v", end, want, err)
		}
		if _, err := result[int](t, b.pool, h.ID+"/c"); !errors.Is(err, workflow.ErrRunCancelled) {
			t.Fatalf("%s: child: want cancelled, got %v", end, err)
		}
	}
	if unreserved.Load() != 3 || refunded.Load() != 1 {
		t.Fatalf("child compensations ran %d times (want 3), parent's %d (want 1)", unreserved.Load(), refunded.Load())
	}
}

// A child collected by Get is not touched by its parent's end, and a run
// continuing as new cancels the children of the generation it leaves.
func TestContinueAsNewCancelsUncollectedChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	done := workflow.MustRegister(b.reg, "quick", func(wctx workflow.Context, _ int) (int, error) { return 5, nil })
	waits := workflow.MustRegister(b.reg, "waits", func(wctx workflow.Context, _ int) (int, error) {
		_, _, err := workflow.WaitSignal[int](wctx, "never", 0)
		return 0, err
	})
	wf := workflow.MustRegister(b.reg, "looper", func(wctx workflow.Context, gen int) (int, error) {
		if gen == 1 {
			return 1, nil
		}
		v, err := workflow.Child(wctx, "quick", done, 0, nil).Get(wctx)
		if err != nil || v != 5 {
			return 0, errors.New("quick child did not complete")
		}
		workflow.Child(wctx, "waits", waits, 0, nil)
		return 0, workflow.ContinueAsNew(wctx, 1)
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "loop"})
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 1 {
		t.Fatal(out, err)
	}
	if _, err := result[int](t, b.pool, "loop/waits"); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("child of the old generation: want cancelled, got %v", err)
	}
	if out, err := result[int](t, b.pool, "loop/quick"); err != nil || out != 5 {
		t.Fatal("collected child:", out, err)
	}
}

// Saga: every registered compensation runs, newest first, even when one
// fails for good; the run ends failed, its error naming the failed
// compensation. Retry runs only the failed compensation again.
func TestEveryCompensationRunsWhenOneFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	var order []string
	var calls [3]atomic.Int32
	wf := workflow.MustRegister(b.reg, "three-undos", func(wctx workflow.Context, _ int) (int, error) {
		for i, name := range []string{"a", "b", "c"} {
			if _, err := workflow.Step(wctx, name, func(ctx context.Context) (int, error) { return i, nil }, nil); err != nil {
				return 0, err
			}
			workflow.Compensate(wctx, "undo-"+name, func(ctx context.Context) error {
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				if calls[i].Add(1) == 1 && name == "b" {
					return core.Permanent(errors.New("undo b broken"))
				}
				return nil
			})
		}
		return workflow.Step(wctx, "last", func(ctx context.Context) (int, error) {
			return 0, core.Permanent(errors.New("last step failed"))
		}, nil)
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "saga3"})
	_, err := result[int](t, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), `"compensate:undo-b"`) ||
		!strings.Contains(err.Error(), "undo b broken") || !strings.Contains(err.Error(), "last step failed") ||
		!strings.Contains(err.Error(), "1 compensation(s) failed") {
		t.Fatalf("want failed, naming compensate:undo-b and the cause, got %v", err)
	}
	mu.Lock()
	got := strings.Join(order, ",")
	mu.Unlock()
	if got != "c,b,a" {
		t.Fatalf("compensations ran %v, want c,b,a", got)
	}
	run, err := workflow.Get(ctx, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, s := range run.Steps {
		states[s.Key] = s.State
	}
	if states["compensate:undo-a"] != "completed" || states["compensate:undo-b"] != "failed" || states["compensate:undo-c"] != "completed" {
		t.Fatalf("compensation steps %v", states)
	}
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunCompensated) {
		t.Fatalf("after retry: want compensated, got %v", err)
	}
	if calls[0].Load() != 1 || calls[1].Load() != 2 || calls[2].Load() != 1 {
		t.Fatalf("undo calls a=%d b=%d c=%d, want 1 2 1", calls[0].Load(), calls[1].Load(), calls[2].Load())
	}
}

// A key given in code that starts with a prefix the package generates keys
// with is refused at the call: the run fails with ErrReservedKey naming
// the key, and the primitive does nothing.
func TestReservedKeysRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var ran atomic.Int32
	noop := func(ctx context.Context) (int, error) { ran.Add(1); return 0, nil }
	kid := workflow.MustRegister(b.reg, "kid", func(wctx workflow.Context, _ int) (int, error) { ran.Add(1); return 0, nil })
	cases := map[string]func(wctx workflow.Context) error{
		"compensate:refund": func(wctx workflow.Context) error {
			workflow.Compensate(wctx, "refund", func(ctx context.Context) error { return nil })
			_, err := workflow.Step(wctx, "compensate:refund", noop, nil)
			return err
		},
		"signal:go#1": func(wctx workflow.Context) error {
			_, err := workflow.StepTx(wctx, "signal:go#1", func(ctx context.Context, tx pgx.Tx) (int, error) { return noop(ctx) }, nil)
			return err
		},
		"patch:v2": func(wctx workflow.Context) error {
			_, err := workflow.Go(wctx, "patch:v2", noop, nil).Get(wctx)
			return err
		},
		"event:status#1": func(wctx workflow.Context) error { return workflow.Sleep(wctx, "event:status#1", 0) },
		"compensate:t":   func(wctx workflow.Context) error { workflow.Now(wctx, "compensate:t"); return nil },
		"2/kid": func(wctx workflow.Context) error {
			_, err := workflow.Child(wctx, "2/kid", kid, 0, nil).Get(wctx)
			return err
		},
	}
	ids := map[string]string{}
	for key, call := range cases {
		wf := workflow.MustRegister(b.reg, "reserved-"+key, func(wctx workflow.Context, _ int) (int, error) {
			return 0, call(wctx)
		})
		h, err := workflow.Start(ctx, b.pool, wf, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[key] = h.ID
	}
	b.start()
	for key, id := range ids {
		_, err := result[int](t, b.pool, id)
		if !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), workflow.ErrReservedKey.Error()) || !strings.Contains(err.Error(), `"`+key+`"`) {
			t.Fatalf("key %q: want failed with ErrReservedKey naming it, got %v", key, err)
		}
		if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1`, id); n != 0 {
			t.Fatalf("key %q: %d steps recorded", key, n)
		}
	}
	if ran.Load() != 0 {
		t.Fatalf("%d refused steps or children ran", ran.Load())
	}
}

// A run's and a step's error text are stored bounded: a 10 MB error is cut
// on a UTF-8 boundary to MaxErrorBytes, ending with a marker; NUL bytes
// (which PostgreSQL text refuses) do not stop the run from failing.
func TestErrorTextBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	huge := strings.Repeat("é", 5<<20) // 10 MiB of two-byte runes
	direct := workflow.MustRegister(b.reg, "huge-error", func(wctx workflow.Context, _ int) (int, error) {
		return 0, errors.New("x" + huge) // odd length: a cut at a fixed byte count splits a rune
	})
	inStep := workflow.MustRegister(b.reg, "huge-step-error", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) {
			return 0, core.Permanent(errors.New("nul\x00" + huge))
		}, nil)
	})
	b.start()
	check := func(what, s string) {
		t.Helper()
		if len(s) > workflow.MaxErrorBytes || !utf8.ValidString(s) || strings.ContainsRune(s, 0) ||
			!strings.HasSuffix(s, "bytes)") || !strings.Contains(s, "…(truncated, ") {
			t.Fatalf("%s: %d bytes, valid UTF-8 %v, ends %q", what, len(s), utf8.ValidString(s), s[max(0, len(s)-40):])
		}
	}
	for _, wf := range []*workflow.Workflow[int, int]{direct, inStep} {
		h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
		_, err := result[int](t, b.pool, h.ID)
		var re *workflow.RunError
		if !errors.As(err, &re) || re.State != workflow.StateFailed {
			t.Fatalf("%s: want a failed run, got %.200v", wf.Name(), err)
		}
		check(wf.Name()+": run error", re.Message)
		run, err := workflow.Get(ctx, b.pool, h.ID)
		if err != nil {
			t.Fatal(err)
		}
		check(wf.Name()+": stored run error", run.Error)
		for _, s := range run.Steps {
			check(wf.Name()+": step error", s.Error)
		}
	}
	if n := b.count(`SELECT max(octet_length(error)) FROM relay_workflow_runs`); n > workflow.MaxErrorBytes {
		t.Fatalf("a stored error has %d bytes", n)
	}
}

// Each attempt of a step's function is kept in the step's attempt log
// (start, end, error), the latest 20, and Get shows it: the admin timeline
// can show a step's retries.
func TestStepAttemptLog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })
	var flaky atomic.Int32
	wf := workflow.MustRegister(b.reg, "retries", func(wctx workflow.Context, _ int) (int, error) {
		v, err := workflow.Step(wctx, "flaky", func(ctx context.Context) (int, error) {
			if n := flaky.Add(1); n < 3 {
				return 0, errors.New("flaky " + itoa(int(n)))
			}
			return 3, nil
		}, &workflow.StepOpts{MaxAttempts: 5, Retry: now})
		if err != nil {
			return 0, err
		}
		if _, err := workflow.StepTx(wctx, "tx", func(ctx context.Context, tx pgx.Tx) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		_, err = workflow.Step(wctx, "hopeless", func(ctx context.Context) (int, error) {
			return 0, errors.New("no luck")
		}, &workflow.StepOpts{MaxAttempts: 23, Retry: now})
		return v, err
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("want failed by hopeless, got %v", err)
	}
	run, err := workflow.Get(ctx, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	logs := map[string][]workflow.StepAttempt{}
	for _, s := range run.Steps {
		logs[s.Key] = s.AttemptLog
	}
	check := func(key string, first, n int, errFor func(attempt int) string) {
		t.Helper()
		log := logs[key]
		if len(log) != n {
			t.Fatalf("%s: %d attempts logged, want %d: %+v", key, len(log), n, log)
		}
		for i, a := range log {
			if a.Attempt != first+i || a.StartedAt.IsZero() || a.FinishedAt.Before(a.StartedAt) || a.Error != errFor(a.Attempt) ||
				(i > 0 && a.StartedAt.Before(log[i-1].FinishedAt)) {
				t.Fatalf("%s: attempt %d logged as %+v", key, first+i, a)
			}
		}
	}
	check("flaky", 1, 3, func(n int) string {
		if n < 3 {
			return "flaky " + itoa(n)
		}
		return ""
	})
	check("tx", 1, 1, func(int) string { return "" })
	check("hopeless", 4, 20, func(int) string { return "no luck" }) // the latest 20 of 23
}

// A run whose job dies (every execution, the reserve ones that would fail
// the run included, crashed or failed) ends failed with a clear error
// instead of staying running behind a dead job: its Result returns, its
// parent is woken (and gets a *ChildError), and its own children are
// cancelled. Killed by the rescuer (a crash) and by a failed last attempt.
func TestRunWithDeadJobEndsFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sleepy := workflow.MustRegister(b.reg, "sleepy", func(wctx workflow.Context, _ int) (int, error) {
		return 0, workflow.Sleep(wctx, "nap", time.Hour)
	})
	var explosions atomic.Int32
	crasher := workflow.MustRegister(b.reg, "crasher", func(wctx workflow.Context, _ int) (int, error) {
		workflow.Child(wctx, "sleepy", sleepy, 0, nil)
		return workflow.Step(wctx, "explode", func(ctx context.Context) (int, error) {
			explosions.Add(1)
			b.rescueNow(wctx.RunID()) // the execution dies here
			return 0, nil
		}, nil)
	})
	parent := workflow.MustRegister(b.reg, "crash-parent", func(wctx workflow.Context, _ int) (int, error) {
		_, err := workflow.Child(wctx, "c", crasher, 0, &workflow.ChildOpts{MaxAttempts: 1}).Get(wctx)
		var ce *workflow.ChildError
		if !errors.As(err, &ce) || ce.State != workflow.StateFailed {
			return 0, errors.New("want a failed child")
		}
		return 1, nil
	})
	// Every execution after the first of a "crasher" run dies before the
	// run's code: as a process that crashes whenever it picks the run up.
	kill := func(ctx context.Context, job *core.JobRow, next func(context.Context) error) error {
		if job.Kind != workflow.RunKind || job.Attempt < 2 || !strings.Contains(string(job.EncodedArgs), "/c") {
			return next(ctx)
		}
		if strings.Contains(string(job.EncodedArgs), "rescued") {
			if _, err := b.pool.Exec(ctx, `UPDATE relay_jobs SET lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second'
				WHERE id = $1 AND state = 'claimed'`, job.ID); err != nil {
				return err
			}
		}
		return errors.New("process died")
	}
	ws := core.NewWorkers()
	if err := b.reg.AddWorkers(ws); err != nil {
		t.Fatal(err)
	}
	ws.Use(kill)
	c, err := core.NewClient(b.pool, &core.Config{Workers: ws, PollInterval: 50 * time.Millisecond, RescueInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Stop(stop)
	})
	for _, id := range []string{"rescued", "failed"} {
		h, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		if out, err := result[int](t, b.pool, h.ID); err != nil || out != 1 {
			t.Fatalf("%s: parent: %v %v", id, out, err)
		}
		_, err = result[int](t, b.pool, h.ID+"/c")
		if !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "4 executions crashed or failed, and its job") ||
			!strings.Contains(err.Error(), "is dead") {
			t.Fatalf("%s: child: want failed with its job dead, got %v", id, err)
		}
		if _, err := result[int](t, b.pool, h.ID+"/c/sleepy"); !errors.Is(err, workflow.ErrRunCancelled) {
			t.Fatalf("%s: grandchild: want cancelled, got %v", id, err)
		}
	}
	if n := explosions.Load(); n != 2 {
		t.Fatalf("the step ran %d times, want once per run", n)
	}
}

// A workflow function that returns an error because its execution was
// stopped (here a shutdown cancels its context; under load, a lease whose
// local deadline passed) does not fail the run: nothing is recorded, and
// the next execution runs the function again.
func TestStoppedExecutionDoesNotFailTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{}, 1)
	var calls atomic.Int32
	wf := workflow.MustRegister(b.reg, "stopped", func(wctx workflow.Context, _ int) (int, error) {
		if calls.Add(1) == 1 {
			started <- struct{}{}
			<-wctx.Done()
			return 0, wctx.Err() // as a query made with wctx would fail
		}
		return 7, nil
	})
	c := b.start()
	h, _ := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	<-started
	// The execution runs until cancelled, so the stop's length does not
	// matter; Stop keeps its last quarter (at most 2s) to record the
	// release, and the 25ms of a 100ms stop can be missed on a loaded
	// machine (in core's tests, so was the 1s of a 4s stop), leaving the
	// job claimed until its 30s lease expires.
	stopCtx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	c.Stop(stopCtx)
	cancel()
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1 AND finished_at IS NOT NULL`, h.ID); n != 0 {
		t.Fatal("the stopped execution recorded the run's end")
	}
	b.start()
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 7 {
		t.Fatal(out, err)
	}
}

// A cancelled run whose compensation failed ends failed; Retry runs again
// only the compensation that failed, with the cancel still asked for, so
// the run ends cancelled. It used to forget the cancel: the replay went on
// with the function past the point where the cancel stopped it (here into
// its hour-long sleep, and then the steps after it).
func TestRetryCancelledRunResumesItsCompensations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var undos, after atomic.Int32
	wf := workflow.MustRegister(b.reg, "cancel-undo", func(wctx workflow.Context, _ int) (int, error) {
		if _, err := workflow.Step(wctx, "a", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "undo-a", func(ctx context.Context) error {
			if undos.Add(1) == 1 {
				return core.Permanent(errors.New("undo a broken"))
			}
			return nil
		})
		if err := workflow.Sleep(wctx, "nap", time.Hour); err != nil {
			return 0, err
		}
		return workflow.Step(wctx, "after", func(ctx context.Context) (int, error) { after.Add(1); return 2, nil }, nil)
	})
	b.start()
	h, err := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "cancel-undo"})
	if err != nil {
		t.Fatal(err)
	}
	b.suspendedJob(h.ID)
	if err := workflow.Cancel(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "undo a broken") {
		t.Fatalf("want failed by its compensation, got %v", err)
	}
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	// Ended, or suspended again in its sleep (the cancel forgotten).
	b.waitFor("the retried run to end or sleep", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs AS r WHERE r.id = $1 AND (r.finished_at IS NOT NULL
			OR EXISTS (SELECT 1 FROM relay_jobs AS j WHERE j.id = r.job_id AND j.state = 'queued' AND j.run_at > now() + interval '10 minutes'))`, h.ID) == 1
	})
	run, err := workflow.Get(ctx, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if run.State != workflow.StateCancelled {
		t.Fatalf("after retry: want cancelled, got %s (%s)", run.State, run.Error)
	}
	if undos.Load() != 2 || after.Load() != 0 {
		t.Fatalf("undo ran %d times (want 2), the step after the sleep %d (want 0)", undos.Load(), after.Load())
	}
}
