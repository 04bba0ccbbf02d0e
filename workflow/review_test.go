package workflow_test

import (
	"errors"
	"github.com/jackc/pgx/v5"
	"strings"
	"time"

	"context"
	"sync/atomic"
	"testing"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// A job that is no longer its run's job (the run was retried, or deleted
// and its id started again, while the old job waited to be rescued) must
// not execute the run: it would be a second execution of the run beside
// the current job's, each under a lease of its own, and could fork it.
func TestStaleJobDoesNotExecuteTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	var calls atomic.Int32
	wf := workflow.MustRegister(b.reg, "stale", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "a", func(ctx context.Context) (int, error) {
			calls.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return 1, nil
		}, nil)
	})
	h, err := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	oldJob := b.count(`SELECT job_id FROM relay_workflow_runs WHERE id = 'r'`)
	// The run failed while its job was left behind (its worker died after
	// recording the outcome, before completing the job); an operator
	// retries it: a new job executes the run.
	if _, err := b.pool.Exec(ctx, `UPDATE relay_workflow_runs SET state = 'failed', finished_at = now(), error = 'x' WHERE id = 'r'`); err != nil {
		t.Fatal(err)
	}
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	b.start()
	b.waitFor("the current job in its step and the stale job ended", func() bool {
		return calls.Load() >= 1 && b.count(`SELECT count(*) FROM relay_jobs WHERE id = $1 AND state = 'succeeded'`, oldJob) == 1
	})
	close(release)
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 1 {
		t.Fatal(out, err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("step ran %d times: two jobs executed the run", n)
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

// A replay that returns while history holds steps after the point it
// returned at (a step removed from the end, a branch on something not
// recorded) is non-determinism, not a completed run.
func TestReturnBeforeHistoryEndsIsNonDeterminism(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var v2 atomic.Bool
	wf := workflow.MustRegister(b.reg, "shrunk", func(wctx workflow.Context, _ int) (int, error) {
		a, err := workflow.Step(wctx, "a", func(ctx context.Context) (int, error) { return 1, nil }, nil)
		if err != nil || v2.Load() {
			return a, err // v2: "b" and the wait were removed
		}
		if _, err := workflow.Step(wctx, "b", func(ctx context.Context) (int, error) { return 2, nil }, nil); err != nil {
			return 0, err
		}
		_, _, err = workflow.WaitSignal[int](wctx, "go", 0)
		return 3, err
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "shrinking"})
	b.waitFor("the run waiting", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND state = 'waiting'`, h.ID) == 1
	})
	v2.Store(true)
	if err := workflow.Signal(ctx, b.pool, h.ID, "go", 1); err != nil {
		t.Fatal(err)
	}
	_, err := result[int](t, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("want a failed run, got %v", err)
	}
	for _, want := range []string{"non-determinism", "shrinking", "position 1", `"step:b"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// A cancel that commits while the parent is about to start a child (after
// the parent last read the cancel flag) still cancels that child: a
// cancelled run leaves no child running.
func TestCancelRacingChildStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sleeper := workflow.MustRegister(b.reg, "sleeper", func(wctx workflow.Context, _ int) (int, error) {
		_, _, err := workflow.WaitSignal[int](wctx, "never", 0)
		return 0, err
	})
	gate := make(chan struct{})
	entered := make(chan struct{})
	wf := workflow.MustRegister(b.reg, "racing-parent", func(wctx workflow.Context, _ int) (int, error) {
		if _, err := workflow.Step(wctx, "gate", func(ctx context.Context) (int, error) {
			close(entered)
			<-gate
			return 0, nil
		}, nil); err != nil {
			return 0, err
		}
		return workflow.Child(wctx, "kid", sleeper, 0, nil).Get(wctx)
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "p"})
	<-entered
	if err := workflow.Cancel(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	close(gate)
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("parent: want cancelled, got %v", err)
	}
	if _, err := result[int](t, b.pool, "p/kid"); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("child: want cancelled, got %v", err)
	}
}

// Retrying a run that failed in its compensations resumes the
// compensations: the step that failed the run is not run again, and the
// compensations that ran are not repeated.
func TestRetryAfterFailedCompensation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var report, unreserve, refund atomic.Int32
	wf := workflow.MustRegister(b.reg, "saga-retry", func(wctx workflow.Context, _ int) (int, error) {
		noop := func(ctx context.Context) (int, error) { return 0, nil }
		if _, err := workflow.Step(wctx, "charge", noop, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "refund", func(ctx context.Context) error {
			if refund.Add(1) == 1 {
				return core.Permanent(errors.New("bank down"))
			}
			return nil
		})
		if _, err := workflow.Step(wctx, "reserve", noop, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "unreserve", func(ctx context.Context) error { unreserve.Add(1); return nil })
		return workflow.Step(wctx, "report", func(ctx context.Context) (int, error) {
			report.Add(1)
			return 0, core.Permanent(errors.New("report broken"))
		}, nil)
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "bank down") {
		t.Fatalf("want failed by the refund, got %v", err)
	}
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunCompensated) {
		t.Fatalf("want compensated after retry, got %v", err)
	}
	if report.Load() != 1 || unreserve.Load() != 1 || refund.Load() != 2 {
		t.Fatalf("report %d, unreserve %d, refund %d calls; want 1 1 2", report.Load(), unreserve.Load(), refund.Load())
	}
}

// A stored step output or run input that no longer decodes into the code's
// types fails that run alone, with the decoding error; the worker and the
// other runs go on.
func TestCorruptStoredRowsFailTheirRunAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "typed", func(wctx workflow.Context, in int) (int, error) {
		n, err := workflow.Step(wctx, "n", func(ctx context.Context) (int, error) { return in + 1, nil }, nil)
		if err != nil {
			return 0, err
		}
		_, _, err = workflow.WaitSignal[int](wctx, "go", 0)
		return n, err
	})
	b.start()
	for _, id := range []string{"bad-output", "bad-input", "good"} {
		if _, err := workflow.Start(ctx, b.pool, wf, 1, &workflow.StartOpts{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	b.waitFor("three runs waiting", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE state = 'waiting'`) == 3
	})
	if _, err := b.pool.Exec(ctx, `UPDATE relay_workflow_steps SET output = '"two"' WHERE run_id = 'bad-output' AND key = 'n'`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE relay_workflow_runs SET input = '{"x": 1}' WHERE id = 'bad-input'`); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"bad-output", "bad-input", "good"} {
		if err := workflow.Signal(ctx, b.pool, id, "go", 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := result[int](t, b.pool, "bad-output"); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), `decode stored output of step "n"`) {
		t.Fatalf("bad-output: %v", err)
	}
	if _, err := result[int](t, b.pool, "bad-input"); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "decode input") {
		t.Fatalf("bad-input: %v", err)
	}
	if out, err := result[int](t, b.pool, "good"); err != nil || out != 2 {
		t.Fatalf("good: %d, %v", out, err)
	}
}

// A child run deleted before its parent read its outcome is the parent's
// *ChildError (which it can handle, or compensate), not an error of every
// execution that spends the parent's attempts.
func TestDeletedChildIsAChildError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	kid := workflow.MustRegister(b.reg, "quick-kid", func(wctx workflow.Context, n int) (int, error) { return n, nil })
	var undone atomic.Int32
	wf := workflow.MustRegister(b.reg, "forgetful", func(wctx workflow.Context, _ int) (int, error) {
		workflow.Compensate(wctx, "undo", func(ctx context.Context) error { undone.Add(1); return nil })
		f := workflow.Child(wctx, "kid", kid, 7, nil)
		if _, _, err := workflow.WaitSignal[int](wctx, "go", 0); err != nil {
			return 0, err
		}
		return f.Get(wctx)
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "forgetful"})
	b.waitFor("the child finished", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'forgetful/kid' AND state = 'completed'`) == 1
	})
	if err := workflow.Delete(ctx, b.pool, "forgetful/kid"); err != nil {
		t.Fatal(err)
	}
	if err := workflow.Signal(ctx, b.pool, h.ID, "go", 1); err != nil {
		t.Fatal(err)
	}
	_, err := result[int](t, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunCompensated) || !strings.Contains(err.Error(), "forgetful/kid") {
		t.Fatalf("want compensated by a child error, got %v", err)
	}
	if n := b.count(`SELECT j.attempt FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id WHERE r.id = $1`, h.ID); n != 1 {
		t.Fatalf("parent job attempt %d, want 1", n)
	}
	if undone.Load() != 1 {
		t.Fatalf("compensation ran %d times", undone.Load())
	}
}

// Retry queues the run's new job as Start placed the first: its priority
// and its bound on crashed executions are kept.
func TestRetryKeepsPriorityAndMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "placed", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "fail", func(ctx context.Context) (int, error) {
			return 0, core.Permanent(errors.New("no"))
		}, nil)
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{Priority: 3, MaxAttempts: 2})
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatal(err)
	}
	first := b.count(`SELECT job_id FROM relay_workflow_runs WHERE id = $1`, h.ID)
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id
		WHERE r.id = $1 AND j.id <> $2 AND j.priority = 3 AND j.max_attempts = 2 + 3`, h.ID, first); n != 1 {
		t.Fatal("the retried run's job lost the run's priority or max attempts")
	}
}

// One patch guards several places of a workflow (as Temporal's GetVersion
// with one change id): every Patch call of that name in a run answers the
// same, the first place's answer. A run started on v1 takes the old path at
// both places; a new one the new path at both.
func TestPatchUsedAtTwoPlaces(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var v2 atomic.Bool
	step := func(wctx workflow.Context, key string) string {
		out, _ := workflow.Step(wctx, key, func(ctx context.Context) (string, error) { return key, nil }, nil)
		return out
	}
	wf := workflow.MustRegister(b.reg, "twice-patched", func(wctx workflow.Context, _ int) (string, error) {
		first := "a"
		if v2.Load() && workflow.Patch(wctx, "p") {
			first = "a2"
		}
		out := step(wctx, first)
		if _, _, err := workflow.WaitSignal[int](wctx, "go", 0); err != nil {
			return "", err
		}
		second := "b"
		if v2.Load() && workflow.Patch(wctx, "p") {
			second = "b2"
		}
		return out + "+" + step(wctx, second), nil
	})
	b.start()
	old, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "old"})
	b.waitFor("v1 run waiting", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'old' AND key = 'signal:go#1'`) == 1
	})
	v2.Store(true)
	fresh, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "new"})
	for _, id := range []string{old.ID, fresh.ID} {
		b.waitFor("run waiting", func() bool {
			return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'signal:go#1'`, id) == 1
		})
		if err := workflow.Signal(ctx, b.pool, id, "go", 1); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := result[string](t, b.pool, old.ID); err != nil || out != "a+b" {
		t.Fatalf("v1 run finished by v2: %q, %v", out, err)
	}
	if out, err := result[string](t, b.pool, fresh.ID); err != nil || out != "a2+b2" {
		t.Fatalf("v2 run: %q, %v", out, err)
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

// The execution that fails a crash-looping run can itself crash (here: its
// outcome's write is held up and its lease rescued meanwhile). The run must
// still end failed, not stay unfinished forever behind a dead job.
func TestFailingACrashLoopingRunSurvivesACrash(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	locked := make(chan pgx.Tx, 1)
	var calls atomic.Int32
	wf := workflow.MustRegister(b.reg, "doomed", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "boom", func(ctx context.Context) (int, error) {
			if calls.Add(1) == 1 {
				// Hold the run's row: this execution's checkpoint and the
				// next execution's outcome wait for it.
				tx, err := b.pool.Begin(context.Background())
				if err != nil {
					return 0, err
				}
				if _, err := tx.Exec(context.Background(), `SELECT 1 FROM relay_workflow_runs WHERE id = $1 FOR UPDATE`, wctx.RunID()); err != nil {
					return 0, err
				}
				locked <- tx
			}
			b.rescueNow(wctx.RunID()) // the execution dies
			return 0, nil
		}, nil)
	})
	b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond})
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "doomed", MaxAttempts: 1})
	tx := <-locked
	b.waitFor("the failing execution's outcome held up", func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 2
	})
	b.rescueNow(h.ID) // the failing execution dies too
	tx.Rollback(ctx)
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("want failed, got %v", err)
	}
}
