package workflow_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

type order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// A run replays: completed steps return their stored outputs, a failed
// step is retried without spending an attempt of the run, and the output
// reaches Result typed.
func TestStepsReplayAndRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls [3]atomic.Int32
	fast := &workflow.StepOpts{Retry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })}
	wf := workflow.MustRegister(b.reg, "chain", func(wctx workflow.Context, o order) (string, error) {
		a, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) {
			calls[0].Add(1)
			return o.Amount * 2, nil
		}, nil)
		if err != nil {
			return "", err
		}
		s, err := workflow.Step(wctx, "flaky", func(ctx context.Context) (string, error) {
			if calls[1].Add(1) < 3 {
				return "", errors.New("smtp down")
			}
			return "sent", nil
		}, fast)
		if err != nil {
			return "", err
		}
		return workflow.Step(wctx, "report", func(ctx context.Context) (string, error) {
			calls[2].Add(1)
			return s + ":" + o.ID + ":" + itoa(a), nil
		}, nil)
	})
	b.start()
	h, err := workflow.Start(context.Background(), b.pool, wf, order{ID: "o1", Amount: 21}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := h.Result(context.Background(), b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if out != "sent:o1:42" {
		t.Fatalf("output %q", out)
	}
	if calls[0].Load() != 1 || calls[1].Load() != 3 || calls[2].Load() != 1 {
		t.Fatalf("calls %d %d %d; want 1 3 1 (completed steps replayed, not rerun)", calls[0].Load(), calls[1].Load(), calls[2].Load())
	}
	if n := b.count(`SELECT attempts FROM relay_workflow_steps WHERE run_id = $1 AND key = 'flaky'`, h.ID); n != 3 {
		t.Fatalf("flaky step attempts %d, want 3", n)
	}
	// Three executions (two step retries) and not one attempt of the run's
	// job spent on them.
	if n := b.count(`SELECT j.attempt FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id WHERE r.id = $1`, h.ID); n != 1 {
		t.Fatalf("run job attempt %d, want 1", n)
	}
	if n := b.count(`SELECT executions FROM relay_workflow_runs WHERE id = $1`, h.ID); n != 3 {
		t.Fatalf("executions %d, want 3", n)
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	s := ""
	for ; i > 0; i /= 10 {
		s = string(rune('0'+i%10)) + s
	}
	return s
}

// A step that fails for good returns a *StepError, and a run returning it
// fails with a RunError.
func TestStepFailsForGood(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := workflow.MustRegister(b.reg, "doomed", func(wctx workflow.Context, _ struct{}) (int, error) {
		_, err := workflow.Step(wctx, "card", func(ctx context.Context) (int, error) {
			return 0, core.Permanent(errors.New("card declined"))
		}, nil)
		var se *workflow.StepError
		if !errors.As(err, &se) || se.Key != "card" || se.Attempts != 1 {
			return 0, errors.New("want a StepError for card, got " + err.Error())
		}
		return 0, err
	})
	b.start()
	h, err := workflow.Start(context.Background(), b.pool, wf, struct{}{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = result[int](t, b.pool, h.ID)
	var re *workflow.RunError
	if !errors.As(err, &re) || !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(re.Message, "card declined") {
		t.Fatalf("result error %v", err)
	}
}

// Start joins the caller's transaction: rolled back, no run; the same id
// twice is one run.
func TestStartInTransactionAndByID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "echo", func(wctx workflow.Context, s string) (string, error) { return s, nil })
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := workflow.Start(ctx, tx, wf, "x", &workflow.StartOpts{ID: "r1"}); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs`); n != 0 {
		t.Fatalf("rolled-back start left %d runs", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs`); n != 0 {
		t.Fatalf("rolled-back start left %d jobs", n)
	}
	h1, err := workflow.Start(ctx, b.pool, wf, "first", &workflow.StartOpts{ID: "r1"})
	if err != nil || h1.Existing {
		t.Fatal(h1, err)
	}
	h2, err := workflow.Start(ctx, b.pool, wf, "second", &workflow.StartOpts{ID: "r1"})
	if err != nil || !h2.Existing || h2.ID != "r1" {
		t.Fatal(h2, err)
	}
	b.start()
	if out, err := result[string](t, b.pool, "r1"); err != nil || out != "first" {
		t.Fatal(out, err)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs`); n != 1 {
		t.Fatalf("%d jobs for one run", n)
	}
	// Another workflow cannot take the id.
	other := workflow.MustRegister(b.reg, "other", func(wctx workflow.Context, s string) (string, error) { return s, nil })
	if _, err := workflow.Start(ctx, b.pool, other, "x", &workflow.StartOpts{ID: "r1"}); !errors.Is(err, workflow.ErrIDInUse) {
		t.Fatalf("want ErrIDInUse, got %v", err)
	}
}

// Bad input is refused before anything is written.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "ch", func(wctx workflow.Context, in any) (int, error) { return 0, nil })
	if _, err := workflow.Start(ctx, b.pool, wf, any(make(chan int)), nil); err == nil || !strings.Contains(err.Error(), "encode input") {
		t.Fatalf("unencodable input: %v", err)
	}
	if _, err := workflow.Start(ctx, b.pool, wf, any(strings.Repeat("x", workflow.MaxPayloadBytes)), nil); !errors.Is(err, workflow.ErrTooLarge) {
		t.Fatalf("oversized input: %v", err)
	}
	if _, _, err := workflow.StartNamed(ctx, b.pool, b.reg, "nope", []byte(`{}`), nil); !errors.Is(err, workflow.ErrUnregistered) {
		t.Fatalf("unregistered: %v", err)
	}
	if _, err := workflow.Register(b.reg, "ch", func(wctx workflow.Context, in any) (int, error) { return 0, nil }); err == nil {
		t.Fatal("registered a name twice")
	}
	// The run's job is checked as core.Enqueue checks a job's names.
	if _, err := workflow.Start(ctx, b.pool, wf, any(1), &workflow.StartOpts{Queue: "q\x00"}); err == nil || !strings.Contains(err.Error(), "queue: contains a NUL byte") {
		t.Fatalf("queue with a NUL byte: %v", err)
	}
	if _, err := workflow.Start(ctx, b.pool, wf, any(1), &workflow.StartOpts{Queue: strings.Repeat("q", 129)}); err == nil || !strings.Contains(err.Error(), "queue: longer than 128 bytes") {
		t.Fatalf("queue of 129 bytes: %v", err)
	}
	if _, err := workflow.Start(ctx, b.pool, wf, any(1), &workflow.StartOpts{ID: "run\x00"}); err == nil || !strings.Contains(err.Error(), "run id: contains a NUL byte") {
		t.Fatalf("run id with a NUL byte: %v", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs`); n != 0 {
		t.Fatalf("bad input wrote %d jobs", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs`); n != 0 {
		t.Fatalf("bad input wrote %d runs", n)
	}
}

// Bad steps: a duplicate key and an oversized output fail the run with a
// clear error; nothing of theirs is checkpointed.
func TestBadSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	dup := workflow.MustRegister(b.reg, "dup", func(wctx workflow.Context, _ int) (int, error) {
		workflow.Step(wctx, "a", func(ctx context.Context) (int, error) { return 1, nil }, nil)
		workflow.Step(wctx, "a", func(ctx context.Context) (int, error) { return 2, nil }, nil)
		return 0, nil
	})
	big := workflow.MustRegister(b.reg, "big", func(wctx workflow.Context, _ int) (int, error) {
		_, err := workflow.Step(wctx, "huge", func(ctx context.Context) (string, error) {
			return strings.Repeat("x", workflow.MaxPayloadBytes), nil
		}, nil)
		return 0, err
	})
	b.start()
	h1, _ := workflow.Start(ctx, b.pool, dup, 0, nil)
	if _, err := result[int](t, b.pool, h1.ID); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "duplicate step key") {
		t.Fatalf("duplicate key: %v", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1`, h1.ID); n != 1 {
		t.Fatalf("%d steps recorded, want 1 (the first a)", n)
	}
	h2, _ := workflow.Start(ctx, b.pool, big, 0, nil)
	if _, err := result[int](t, b.pool, h2.ID); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "payload too large") {
		t.Fatalf("oversized output: %v", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND output IS NOT NULL`, h2.ID); n != 0 {
		t.Fatal("oversized output stored")
	}
}

// A replay that meets another key than history's fails the run, naming
// the run, the position and both keys.
func TestNonDeterminism(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var version atomic.Int32
	wf := workflow.MustRegister(b.reg, "drift", func(wctx workflow.Context, _ int) (int, error) {
		key := "charge"
		if version.Load() == 2 {
			key = "charge-v2"
		}
		if _, err := workflow.Step(wctx, key, func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		version.Store(2) // the code "changes" before the next execution
		if err := workflow.Sleep(wctx, "nap", 0); err != nil {
			return 0, err
		}
		return 1, nil
	})
	b.start()
	h, _ := workflow.Start(context.Background(), b.pool, wf, 0, &workflow.StartOpts{ID: "drifter"})
	_, err := result[int](t, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("want a failed run, got %v", err)
	}
	for _, want := range []string{"non-determinism", "drifter", "position 0", `"step:charge"`, `"step:charge-v2"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// Sleeping and retrying never use the run's attempts: a run with two
// attempts suspends fifty times and completes.
func TestSuspensionsAreNotAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := workflow.MustRegister(b.reg, "napper", func(wctx workflow.Context, n int) (int, error) {
		for i := 0; i < n; i++ {
			if err := workflow.Sleep(wctx, "nap-"+itoa(i), 0); err != nil {
				return 0, err
			}
		}
		return n, nil
	})
	b.start()
	h, _ := workflow.Start(context.Background(), b.pool, wf, 50, &workflow.StartOpts{MaxAttempts: 2})
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 50 {
		t.Fatal(out, err)
	}
	if n := b.count(`SELECT j.attempt FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id WHERE r.id = $1`, h.ID); n != 1 {
		t.Fatalf("run job attempt %d, want 1", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND state = 'completed'`, h.ID); n != 50 {
		t.Fatalf("%d sleeps completed, want 50", n)
	}
}

// A durable sleep: the run is not executed again before its wake-up.
func TestSleepWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var execs atomic.Int32
	wf := workflow.MustRegister(b.reg, "sleeper", func(wctx workflow.Context, _ int) (time.Duration, error) {
		execs.Add(1)
		began, err := workflow.Step(wctx, "began", func(ctx context.Context) (time.Time, error) { return time.Now(), nil }, nil)
		if err != nil {
			return 0, err
		}
		if err := workflow.Sleep(wctx, "nap", 300*time.Millisecond); err != nil {
			return 0, err
		}
		return time.Since(began), nil
	})
	b.start()
	h, _ := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	slept, err := result[time.Duration](t, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if slept < 300*time.Millisecond {
		t.Fatalf("woke after %s, before the 300ms sleep ended", slept)
	}
	if execs.Load() != 2 {
		t.Fatalf("%d executions, want 2", execs.Load())
	}
	_ = pgx.ErrNoRows
}

// SleepUntil waits for an instant; a step's Timeout bounds each attempt.
func TestSleepUntilAndStepTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := workflow.MustRegister(b.reg, "until", func(wctx workflow.Context, at time.Time) (string, error) {
		if err := workflow.SleepUntil(wctx, "wake", at); err != nil {
			return "", err
		}
		woke := workflow.Now(wctx, "woke")
		_, err := workflow.Step(wctx, "slow", func(ctx context.Context) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		}, &workflow.StepOpts{MaxAttempts: 1, Timeout: 50 * time.Millisecond})
		if woke.Before(at) {
			return "early", nil
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			return "no timeout: " + errString(err), nil
		}
		return "ok", nil
	})
	b.start()
	h, _ := workflow.Start(context.Background(), b.pool, wf, time.Now().Add(300*time.Millisecond), nil)
	if out, err := result[string](t, b.pool, h.ID); err != nil || out != "ok" {
		t.Fatal(out, err)
	}
}

// A finished run is announced on channel relay_workflow (payload its id)
// once its outcome has committed, for Result callers: a listener sees the
// notification, and the run reads finished when it does.
func TestFinishedRunIsAnnounced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := workflow.MustRegister(b.reg, "announced", func(wctx workflow.Context, n int) (int, error) {
		return workflow.Step(wctx, "double", func(context.Context) (int, error) { return 2 * n, nil }, nil)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, b.pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `LISTEN relay_workflow`); err != nil {
		t.Fatal(err)
	}
	b.start()
	h, err := workflow.Start(ctx, b.pool, wf, 21, nil)
	if err != nil {
		t.Fatal(err)
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("no announcement of run %s: %v", h.ID, err)
		}
		if n.Payload == h.ID {
			break
		}
	}
	if got := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1 AND state = 'completed' AND output = '42'`, h.ID); got != 1 {
		t.Fatalf("run %s announced but not completed with 42", h.ID)
	}
}

// A run started on a pool (its own transaction, whose job's wake-up is
// sent after the commit) and one started in a caller's transaction (whose
// wake-up rides on its commit) are both picked up by their notification:
// the workers here never poll.
func TestStartWakesTheWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := workflow.MustRegister(b.reg, "woken", func(wctx workflow.Context, n int) (int, error) {
		return workflow.Step(wctx, "inc", func(context.Context) (int, error) { return n + 1, nil }, nil)
	})
	b.startWith(&core.Config{PollInterval: time.Hour})
	ctx := context.Background()
	for i := range 3 {
		h, err := workflow.Start(ctx, b.pool, wf, i, nil)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := result[int](t, b.pool, h.ID); err != nil || out != i+1 {
			t.Fatalf("run started on the pool: %d, %v", out, err)
		}
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h, err := workflow.Start(ctx, tx, wf, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 11 {
		t.Fatalf("run started in a transaction: %d, %v", out, err)
	}
}

// Registry.Close stops the Result listener; a Handle.Result after it
// still returns the outcome (by polling).
func TestResultAfterRegistryClose(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := workflow.MustRegister(b.reg, "closed", func(wctx workflow.Context, n int) (int, error) {
		return workflow.Step(wctx, "triple", func(context.Context) (int, error) { return 3 * n, nil }, nil)
	})
	b.start()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h, err := workflow.Start(ctx, b.pool, wf, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := h.Result(ctx, b.pool); err != nil || out != 6 {
		t.Fatalf("before Close: %d, %v", out, err)
	}
	listeners := func() int {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = 'relay-workflow-results' AND datname = current_database()`)
	}
	if n := listeners(); n != 1 {
		t.Fatalf("%d Result listeners before Close, want 1 (it stays a while after its last caller)", n)
	}
	b.reg.Close()
	b.waitFor("the Result listener to disconnect", func() bool { return listeners() == 0 })
	h2, err := workflow.Start(ctx, b.pool, wf, 5, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := h2.Result(ctx, b.pool); err != nil || out != 15 {
		t.Fatalf("after Close: %d, %v", out, err)
	}
	if n := listeners(); n != 0 {
		t.Fatalf("a Result after Close opened a listener (%d connections)", n)
	}
}

// A Result already waiting when the registry is closed goes on polling and
// returns the run's outcome as soon as it is there, as does one started
// after Close while the listener had not connected.
func TestResultWaitingAcrossRegistryClose(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	wf := workflow.MustRegister(b.reg, "gated", func(wctx workflow.Context, n int) (int, error) {
		return workflow.Step(wctx, "wait", func(context.Context) (int, error) { <-release; return n, nil }, nil)
	})
	b.start()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h, err := workflow.Start(ctx, b.pool, wf, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		out int
		err error
	}
	done := make(chan res, 1)
	go func() {
		out, err := h.Result(ctx, b.pool)
		done <- res{out, err}
	}()
	b.waitFor("the Result listener", func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = 'relay-workflow-results' AND datname = current_database()`) == 1
	})
	b.reg.Close()
	close(release)
	r := <-done
	if r.err != nil || r.out != 7 {
		t.Fatalf("%d, %v", r.out, r.err)
	}
}

// A run of a workflow this process does not know (a rolling deploy: the
// run was started by newer code) is put back without spending the run's
// attempts, and a process that knows it runs it.
func TestUnregisteredWorkflowWaitsForAProcessThatKnowsIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	newer := workflow.NewRegistry(b.pool, nil)
	wf := workflow.MustRegister(newer, "new-flow", func(wctx workflow.Context, n int) (int, error) {
		return workflow.Step(wctx, "double", func(ctx context.Context) (int, error) { return 2 * n, nil }, nil)
	})
	h, err := workflow.Start(ctx, b.pool, wf, 21, &workflow.StartOpts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	old := b.start() // b.reg does not know "new-flow"
	b.waitFor("an execution by the old process, put back", func() bool {
		return b.reg.Stats().Executions >= 1 &&
			b.count(`SELECT count(*) FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id WHERE r.id = $1 AND j.state <> 'claimed'`, h.ID) == 1
	})
	if n := b.count(`SELECT j.attempt FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id WHERE r.id = $1`, h.ID); n != 0 {
		t.Fatalf("run job attempt %d: an unknown workflow spent the run's attempts", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1 AND state = 'pending'`, h.ID); n != 1 {
		t.Fatal("the run did not stay pending")
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	old.Stop(stopCtx)
	ws := core.NewWorkers()
	if err := newer.AddWorkers(ws); err != nil {
		t.Fatal(err)
	}
	c, err := core.NewClient(b.pool, &core.Config{Workers: ws, PollInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(stopCtx) })
	if _, err := b.pool.Exec(ctx, `UPDATE relay_jobs SET run_at = now() WHERE id = (SELECT job_id FROM relay_workflow_runs WHERE id = $1) AND state = 'queued'`, h.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 42 {
		t.Fatal(out, err)
	}
}

// A registry made without a pool (a process that only starts runs) waits
// for results by polling: its Handle.Result has no listener to start.
func TestResultFromARegistryWithoutPool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	fn := func(wctx workflow.Context, n int) (int, error) { return n + 1, nil }
	workflow.MustRegister(b.reg, "inc", fn)
	starter := workflow.NewRegistry(nil, nil)
	wf := workflow.MustRegister(starter, "inc", fn)
	b.start()
	h, err := workflow.Start(ctx, b.pool, wf, 41, nil)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if out, err := h.Result(rctx, b.pool); err != nil || out != 42 {
		t.Fatal(out, err)
	}
}
