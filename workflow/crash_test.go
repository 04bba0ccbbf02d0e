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

// A run whose executions keep dying (here: losing their lease mid-step,
// as a worker killed by the step would) ends failed when its attempts are
// used up, instead of crash-looping.
func TestCrashingRunEndsFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	wf := workflow.MustRegister(b.reg, "killer", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "explode", func(ctx context.Context) (int, error) {
			calls.Add(1)
			b.rescueNow(wctx.RunID())
			return 0, nil
		}, nil)
	})
	b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond})
	h, _ := workflow.Start(context.Background(), b.pool, wf, 0, &workflow.StartOpts{MaxAttempts: 3})
	_, err := result[int](t, b.pool, h.ID)
	// The message says what the last of them died of.
	if !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "3 executions crashed") || !strings.Contains(err.Error(), "lease expired") {
		t.Fatalf("want a failed run, got %v", err)
	}
	if calls.Load() != 3 {
		t.Fatalf("step ran %d times, want 3 (the fourth execution fails the run)", calls.Load())
	}
}

// A worker dying right after a checkpoint commits, on a queue with one
// worker: the rescued run resumes after that checkpoint (DBOS Python #805)
// and is not stuck between two completed steps.
func TestResumeAfterCheckpointOnSingleWorkerQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var a, c atomic.Int32
	wf := workflow.MustRegister(b.reg, "resume", func(wctx workflow.Context, _ int) (int, error) {
		x, err := workflow.Step(wctx, "a", func(ctx context.Context) (int, error) { return int(a.Add(1)), nil }, nil)
		if err != nil {
			return 0, err
		}
		y, err := workflow.Step(wctx, "b", func(ctx context.Context) (int, error) {
			if c.Add(1) == 1 {
				b.rescueNow(wctx.RunID()) // "a" is committed; the worker dies now
				return 0, errors.New("killed")
			}
			return 10, nil
		}, nil)
		return x + y, err
	})
	b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	h, _ := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 11 {
		t.Fatal(out, err)
	}
	if a.Load() != 1 || c.Load() != 2 {
		t.Fatalf("a ran %d times (want 1), b %d (want 2)", a.Load(), c.Load())
	}
}

// A run with 10,000 checkpoints resumes from one history query: every step
// replays without running. The time is logged (go test -v -run
// TestLongHistoryReplay), not asserted.
func TestLongHistoryReplay(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("long history")
	}
	b := setup(t)
	const n = 10000
	var ran atomic.Int32
	wf := workflow.MustRegister(b.reg, "long", func(wctx workflow.Context, _ int) (int, error) {
		sum := 0
		for i := 0; i < n; i++ {
			v, err := workflow.Step(wctx, "s"+itoa(i), func(ctx context.Context) (int, error) { ran.Add(1); return 1, nil }, nil)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	})
	ctx := context.Background()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	// The history of a run that did all its steps and then crashed.
	if _, err := b.pool.Exec(ctx, `
		INSERT INTO relay_workflow_steps (run_id, position, key, kind, state, output, attempts, finished_at)
		SELECT $1, i, 's' || i, 'step', 'completed', '1', 1, now() FROM generate_series(0, $2 - 1) AS i`, h.ID, n); err != nil {
		t.Fatal(err)
	}
	b.start()
	began := time.Now()
	out, err := result[int](t, b.pool, h.ID)
	if err != nil || out != n {
		t.Fatal(out, err)
	}
	t.Logf("replayed %d checkpoints and finished in %s", n, time.Since(began))
	if ran.Load() != 0 {
		t.Fatalf("%d steps ran again", ran.Load())
	}
	if st := b.reg.Stats(); st.Replayed != n || st.Executions != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A shutdown that interrupts a step is not the step's failure: nothing is
// recorded, and the next client runs the step again as its first attempt.
func TestShutdownDoesNotFailTheStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{}, 1)
	var calls atomic.Int32
	wf := workflow.MustRegister(b.reg, "interrupted", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "long", func(ctx context.Context) (int, error) {
			if calls.Add(1) == 1 {
				started <- struct{}{}
				<-ctx.Done()
				return 0, ctx.Err()
			}
			return 7, nil
		}, &workflow.StepOpts{MaxAttempts: 1})
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
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1`, h.ID); n != 0 {
		t.Fatalf("%d steps recorded for an interrupted step", n)
	}
	b.start()
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 7 {
		t.Fatal(out, err)
	}
	if n := b.count(`SELECT attempts FROM relay_workflow_steps WHERE run_id = $1 AND key = 'long'`, h.ID); n != 1 {
		t.Fatalf("attempts %d, want 1", n)
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
