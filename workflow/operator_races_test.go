package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// Retry is for failed runs only: a cancelled and a compensated run are
// ErrNotRetryable, and the refusal changes neither the run nor its job.
func TestRetryRefusesACancelledOrCompensatedRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "undoable", func(wctx workflow.Context, fail bool) (int, error) {
		if _, err := workflow.Step(wctx, "do", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "undo", func(ctx context.Context) error { return nil })
		if fail {
			return 0, errors.New("a check failed")
		}
		_, _, err := workflow.WaitSignal[int](wctx, "never", 0)
		return 0, err
	})
	b.start()
	compensated, _ := workflow.Start(ctx, b.pool, wf, true, nil)
	cancelled, _ := workflow.Start(ctx, b.pool, wf, false, nil)
	if _, err := result[int](t, b.pool, compensated.ID); !errors.Is(err, workflow.ErrRunCompensated) {
		t.Fatalf("want compensated, got %v", err)
	}
	b.waitFor("the run waits", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND state = 'waiting'`, cancelled.ID) == 1
	})
	if err := workflow.Cancel(ctx, b.pool, cancelled.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, cancelled.ID); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("want cancelled, got %v", err)
	}
	for _, id := range []string{compensated.ID, cancelled.ID} {
		before := b.count(`SELECT count(*) FROM relay_jobs`)
		if err := workflow.Retry(ctx, b.pool, id); !errors.Is(err, workflow.ErrNotRetryable) {
			t.Fatalf("retry of %s: %v, want ErrNotRetryable", id, err)
		}
		if n := b.count(`SELECT count(*) FROM relay_jobs`); n != before {
			t.Fatalf("a refused retry left %d jobs, before %d", n, before)
		}
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE state IN ('compensated', 'cancelled') AND finished_at IS NOT NULL`); n != 2 {
		t.Fatalf("%d runs still finished as they were, want 2", n)
	}
}

// Two Retry calls on one failed run, each in its own transaction and at
// the same time: one puts it back with a new job, the other waits for it
// and is ErrNotRetryable; the run has one job to execute it, and its
// StepTx effect is there once when it completes.
func TestConcurrentRetriesMakeOneJob(t *testing.T) {
	t.Parallel()
	c := newRetryCase(t)
	b := c.b
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "retry-race", func(wctx workflow.Context, _ int) (int, error) {
		if err := c.book(wctx); err != nil {
			return 0, err
		}
		return 1, c.later()
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("want failed, got %v", err)
	}
	c.check.Store(false)
	// The first Retry holds the run's row in an open transaction; the
	// second, in another, waits for it.
	first, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	if err := workflow.Retry(ctx, first, h.ID); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() { second <- workflow.Retry(ctx, b.pool, h.ID) }()
	b.waitFor("the second Retry waits for the run's row", func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%UPDATE relay_workflow_runs AS r%'`) > 0
	})
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-second:
		if !errors.Is(err, workflow.ErrNotRetryable) {
			t.Fatalf("the second Retry: %v, want ErrNotRetryable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second Retry did not return")
	}
	if _, err := result[int](t, b.pool, h.ID); err != nil {
		t.Fatalf("want completed after the retry, got %v", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs WHERE args->>'run_id' = $1`, h.ID); n != 2 {
		t.Fatalf("%d jobs executed the run, want 2 (the first, the retry's)", n)
	}
	if n := b.count(`SELECT count(*) FROM bookings WHERE run_id = $1`, h.ID); n != 1 {
		t.Fatalf("the StepTx's row exists %d times", n)
	}
}

// A Cancel that arrives while a failed run compensates (its compensation
// running) ends the run cancelled, as the state machine's compensating →
// cancelled says, with each compensation run once; Cancel returns nil.
func TestCancelDuringCompensation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	g := newGate()
	var mu sync.Mutex
	undone := map[string]int{}
	wf := workflow.MustRegister(b.reg, "fails-then-undoes", func(wctx workflow.Context, _ int) (int, error) {
		for _, key := range []string{"a", "b"} {
			if _, err := workflow.Step(wctx, key, func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
				return 0, err
			}
			workflow.Compensate(wctx, "undo-"+key, func(ctx context.Context) error {
				mu.Lock()
				undone[key]++
				mu.Unlock()
				if key == "b" {
					g.pass() // the newest runs first: a is undone after the Cancel
				}
				return nil
			})
		}
		return 0, errors.New("a check failed")
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	g.waitEntered(t)
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1 AND state = 'compensating'`, h.ID); n != 1 {
		t.Fatal("the run is not compensating")
	}
	if err := workflow.Cancel(ctx, b.pool, h.ID); err != nil {
		t.Fatalf("Cancel during compensation: %v", err)
	}
	close(g.open)
	_, err := result[int](t, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("Cancel returned nil during compensation; the run ended %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if undone["a"] != 1 || undone["b"] != 1 {
		t.Fatalf("compensations ran %v, want each once", undone)
	}
}

// Cancel racing a run's completion, at every moment from its start to its
// end: each Cancel that returned nil ends its run cancelled, and each that
// said the run finished names "completed", whose output stands. Nothing in
// between.
func TestCancelRacingCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "short", func(wctx workflow.Context, n int) (int, error) {
		for i := range 3 {
			if _, err := workflow.Step(wctx, fmt.Sprint("s", i), func(ctx context.Context) (int, error) { return i, nil }, nil); err != nil {
				return 0, err
			}
		}
		return n, nil
	})
	b.start()
	const runs = 30
	ids := make([]string, runs)
	errs := make([]error, runs)
	var wg sync.WaitGroup
	for i := range runs {
		h, err := workflow.Start(ctx, b.pool, wf, i, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = h.ID
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread over the run's life: some before it starts, some
			// during its steps, some after it completed.
			time.Sleep(time.Duration(i) * 3 * time.Millisecond)
			errs[i] = workflow.Cancel(ctx, b.pool, ids[i])
		}()
	}
	wg.Wait()
	outcomes := map[string]int{}
	for i, id := range ids {
		out, err := result[int](t, b.pool, id)
		switch {
		case errs[i] == nil && errors.Is(err, workflow.ErrRunCancelled):
			outcomes["cancelled"]++
		case errors.Is(errs[i], workflow.ErrRunFinished) && err == nil && out == i:
			outcomes["completed"]++
		default:
			t.Fatalf("run %d: Cancel said %v, the run ended %d, %v", i, errs[i], out, err)
		}
	}
	t.Logf("outcomes: %v", outcomes)
}

// Delete of a run mid-step is refused and deletes nothing: the step goes
// on and the run completes; once finished it is deleted, and the id starts
// anew with an empty mailbox (a signal sent to the old run is not the new
// run's).
func TestDeleteMidStepIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	g := newGate()
	wf := workflow.MustRegister(b.reg, "held", func(wctx workflow.Context, n int) (int, error) {
		out, err := workflow.StepTx(wctx, "hold", func(ctx context.Context, tx pgx.Tx) (int, error) {
			if n == 0 {
				g.pass()
			}
			return n, nil
		}, nil)
		if err != nil {
			return 0, err
		}
		v, ok, err := workflow.WaitSignal[int](wctx, "go", time.Millisecond)
		if err != nil {
			return 0, err
		}
		if ok {
			return out + v, nil
		}
		return out, nil
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "del"})
	g.waitEntered(t)
	if err := workflow.Delete(ctx, b.pool, h.ID); err == nil {
		t.Fatal("Delete of a running run returned nil")
	}
	close(g.open)
	if _, err := result[int](t, b.pool, h.ID); err != nil {
		t.Fatalf("the run after a refused Delete: %v", err)
	}
	if err := workflow.Signal(ctx, b.pool, h.ID, "go", 100); !errors.Is(err, workflow.ErrRunFinished) {
		t.Fatalf("signal to the finished run: %v", err)
	}
	if err := workflow.Delete(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if err := workflow.Signal(ctx, b.pool, h.ID, "go", 100); !errors.Is(err, workflow.ErrRunNotFound) {
		t.Fatalf("signal to the deleted run: %v", err)
	}
	if _, err := workflow.Start(ctx, b.pool, wf, 5, &workflow.StartOpts{ID: "del"}); err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, b.pool, "del"); err != nil || out != 5 {
		t.Fatalf("the id started anew: %d, %v (want 5: no signal of the old run)", out, err)
	}
	_ = core.DefaultQueue
}

// The database refuses a compensated end while a cancel is requested,
// whoever writes it, as it refuses a completed one.
func TestCompensatedRefusedWhileCancelRequested(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.exec(`INSERT INTO relay_workflow_runs (id, workflow, input, queue) VALUES ('r', 'w', 'null', 'default')`)
	b.exec(`UPDATE relay_workflow_runs SET state = 'running' WHERE id = 'r'`)
	b.exec(`UPDATE relay_workflow_runs SET state = 'compensating', cancel_requested = true WHERE id = 'r'`)
	_, err := b.pool.Exec(ctx, `UPDATE relay_workflow_runs SET state = 'compensated', error = 'x', finished_at = now() WHERE id = 'r'`)
	if err == nil || !strings.Contains(err.Error(), "cannot end compensated while a cancel is requested") {
		t.Fatalf("compensated over a requested cancel: %v", err)
	}
	b.exec(`UPDATE relay_workflow_runs SET state = 'cancelled', error = 'cancelled', finished_at = now() WHERE id = 'r'`)
}
