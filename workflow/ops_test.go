package workflow_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// Cancel: a run waiting for a signal, with a child asleep, is woken; the
// child is cancelled too; the run's compensation runs; it ends cancelled.
func TestCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createPayments(t, b)
	ctx := context.Background()
	nap := workflow.MustRegister(b.reg, "nap", func(wctx workflow.Context, _ int) (int, error) {
		return 0, workflow.Sleep(wctx, "long", time.Hour)
	})
	wf := workflow.MustRegister(b.reg, "cancellable", func(wctx workflow.Context, _ int) (int, error) {
		if _, err := workflow.StepTx(wctx, "charge", func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1, 10)`, wctx.RunID())
			return 0, err
		}, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "refund", func(ctx context.Context) error {
			_, err := b.pool.Exec(ctx, `INSERT INTO payments VALUES ('refund', -10)`)
			return err
		})
		workflow.Child(wctx, "nap", nap, 0, nil)
		_, _, err := workflow.WaitSignal[int](wctx, "never", 0)
		return 0, err
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "c"})
	b.waitFor("run waiting and child asleep", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE state = 'waiting' AND key IN ('long', 'signal:never#1')`) == 2
	})
	if err := workflow.Cancel(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("want cancelled, got %v", err)
	}
	if _, err := result[int](t, b.pool, "c/nap"); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("child: want cancelled, got %v", err)
	}
	if n := b.count(`SELECT coalesce(sum(amount), 99) FROM payments`); n != 0 {
		t.Fatalf("payments sum %d: refund did not run once", n)
	}
	if err := workflow.Cancel(ctx, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFinished) {
		t.Fatalf("cancel a finished run: %v", err)
	}
}

// Retry resumes a failed run from its failed step: the steps before it
// are not repeated.
func TestRetryFromFailedStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var firstCalls atomic.Int32
	var broken atomic.Bool
	broken.Store(true)
	wf := workflow.MustRegister(b.reg, "retryable", func(wctx workflow.Context, _ int) (string, error) {
		a, err := workflow.Step(wctx, "first", func(ctx context.Context) (string, error) { firstCalls.Add(1); return "a", nil }, nil)
		if err != nil {
			return "", err
		}
		c, err := workflow.Step(wctx, "second", func(ctx context.Context) (string, error) {
			if broken.Load() {
				return "", errors.New("dependency down")
			}
			return "b", nil
		}, &workflow.StepOpts{MaxAttempts: 1})
		return a + c, err
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	if _, err := result[string](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("want failed, got %v", err)
	}
	if err := workflow.Retry(ctx, b.pool, "nope"); !errors.Is(err, workflow.ErrRunNotFound) {
		t.Fatalf("retry unknown run: %v", err)
	}
	broken.Store(false)
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := result[string](t, b.pool, h.ID); err != nil || out != "ab" {
		t.Fatal(out, err)
	}
	if firstCalls.Load() != 1 {
		t.Fatalf("first step ran %d times", firstCalls.Load())
	}
	if err := workflow.Retry(ctx, b.pool, h.ID); !errors.Is(err, workflow.ErrNotRetryable) {
		t.Fatalf("retry a completed run: %v", err)
	}
}

// Get shows the step timeline; List pages newest first.
func TestGetAndList(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "two", func(wctx workflow.Context, n int) (int, error) {
		a, _ := workflow.Step(wctx, "one", func(ctx context.Context) (int, error) { return n, nil }, nil)
		if err := workflow.Sleep(wctx, "pause", 0); err != nil {
			return 0, err
		}
		return workflow.Step(wctx, "two", func(ctx context.Context) (int, error) { return a + 1, nil }, nil)
	})
	b.start()
	for i := 0; i < 3; i++ {
		h, _ := workflow.Start(ctx, b.pool, wf, i, &workflow.StartOpts{ID: "run-" + itoa(i)})
		if _, err := result[int](t, b.pool, h.ID); err != nil {
			t.Fatal(err)
		}
	}
	run, err := workflow.Get(ctx, b.pool, "run-2")
	if err != nil {
		t.Fatal(err)
	}
	if run.State != workflow.StateCompleted || string(run.Output) != "3" || len(run.Steps) != 3 {
		t.Fatalf("run %+v", run)
	}
	for i, want := range []string{"one", "pause", "two"} {
		if s := run.Steps[i]; s.Key != want || s.State != "completed" || s.FinishedAt == nil {
			t.Fatalf("step %d: %+v", i, s)
		}
	}
	page, err := workflow.List(ctx, b.pool, &workflow.ListOpts{Workflow: "two", Limit: 2})
	if err != nil || len(page) != 2 {
		t.Fatal(page, err)
	}
	rest, err := workflow.List(ctx, b.pool, &workflow.ListOpts{Workflow: "two", Limit: 2, After: page[1]})
	if err != nil || len(rest) != 1 {
		t.Fatal(rest, err)
	}
	seen := map[string]bool{page[0].ID: true, page[1].ID: true, rest[0].ID: true}
	if len(seen) != 3 {
		t.Fatalf("pages overlap: %v", seen)
	}
	if _, err := workflow.Get(ctx, b.pool, "nope"); !errors.Is(err, workflow.ErrRunNotFound) {
		t.Fatal(err)
	}
}

// A run deleted by retention takes its steps with it: the same id started
// again replays nothing of the old run (DBOS Python #769).
func TestDeletedRunIDReused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var calls atomic.Int32
	wf := workflow.MustRegister(b.reg, "reuse", func(wctx workflow.Context, n int) (int, error) {
		return workflow.Step(wctx, "double", func(ctx context.Context) (int, error) { calls.Add(1); return 2 * n, nil }, nil)
	})
	b.start()
	workflow.Start(ctx, b.pool, wf, 1, &workflow.StartOpts{ID: "same"})
	if out, err := result[int](t, b.pool, "same"); err != nil || out != 2 {
		t.Fatal(out, err)
	}
	if err := workflow.Delete(ctx, b.pool, "same"); err != nil {
		t.Fatal(err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'same'`); n != 0 {
		t.Fatalf("%d steps outlived their run", n)
	}
	h, err := workflow.Start(ctx, b.pool, wf, 5, &workflow.StartOpts{ID: "same"})
	if err != nil || h.Existing {
		t.Fatal(h, err)
	}
	if out, err := result[int](t, b.pool, "same"); err != nil || out != 10 {
		t.Fatalf("reused id replayed the old run: %d, %v", out, err)
	}
	if calls.Load() != 2 {
		t.Fatalf("step ran %d times, want 2", calls.Load())
	}
	// Retention by age deletes it, and only finished runs.
	if err := workflow.Delete(ctx, b.pool, "nope"); !errors.Is(err, workflow.ErrRunNotFound) {
		t.Fatal(err)
	}
	n, err := workflow.DeleteFinished(ctx, b.pool, 0, 0)
	if err != nil || n != 1 {
		t.Fatal(n, err)
	}
	if c := b.count(`SELECT count(*) FROM relay_workflow_runs`); c != 0 {
		t.Fatalf("%d runs left", c)
	}
}

// The run state machine: the trigger, the Go table and docs/workflow.md
// agree, pair by pair.
func TestRunStateMachine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	doc, err := os.ReadFile("../docs/workflow.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[[2]workflow.RunState]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		f := strings.Split(line, "|")
		if len(f) < 4 || !strings.HasPrefix(strings.TrimSpace(f[1]), "`") {
			continue
		}
		from := workflow.RunState(strings.Trim(strings.TrimSpace(f[1]), "`"))
		to := workflow.RunState(strings.Trim(strings.TrimSpace(f[2]), "`"))
		documented[[2]workflow.RunState{from, to}] = true
	}
	if len(documented) == 0 {
		t.Fatal("no transitions table in docs/workflow.md")
	}
	for _, from := range workflow.RunStates() {
		for _, to := range workflow.RunStates() {
			if from == to {
				continue
			}
			allowed := from.CanTransitionTo(to)
			if documented[[2]workflow.RunState{from, to}] != allowed {
				t.Errorf("%s -> %s: Go says %v, docs say %v", from, to, allowed, !allowed)
			}
			id := string(from) + "-" + string(to)
			if _, err := b.pool.Exec(ctx, `INSERT INTO relay_workflow_runs (id, workflow, input, queue) VALUES ($1, 'w', '{}', 'q')`, id); err != nil {
				t.Fatal(err)
			}
			// Put the row in state from, around the trigger.
			if _, err := b.pool.Exec(ctx, `ALTER TABLE relay_workflow_runs DISABLE TRIGGER relay_workflow_runs_check;
				UPDATE relay_workflow_runs SET state = '`+string(from)+`', finished_at = CASE WHEN '`+string(from)+`' IN ('completed', 'failed', 'compensated', 'cancelled', 'terminated') THEN now() END WHERE id = '`+id+`';
				ALTER TABLE relay_workflow_runs ENABLE TRIGGER relay_workflow_runs_check`); err != nil {
				t.Fatal(err)
			}
			_, err := b.pool.Exec(ctx, `UPDATE relay_workflow_runs SET state = $2,
				finished_at = CASE WHEN $2 IN ('completed', 'failed', 'compensated', 'cancelled', 'terminated') THEN now() END WHERE id = $1`, id, string(to))
			if (err == nil) != allowed {
				t.Errorf("%s -> %s: trigger says %v, Go says %v", from, to, err, allowed)
			}
		}
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO relay_workflow_runs (id, workflow, input, queue, state) VALUES ('bad', 'w', '{}', 'q', 'running')`); err == nil {
		t.Error("a run was inserted running")
	}
}

// Cancel lands while a run is busy checkpointing: it stops at a step
// boundary, compensates and ends cancelled (no deadlock between the cancel
// and the checkpoints).
func TestCancelBusyRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var undone atomic.Int32
	wf := workflow.MustRegister(b.reg, "busy", func(wctx workflow.Context, _ int) (int, error) {
		workflow.Compensate(wctx, "undo", func(ctx context.Context) error { undone.Add(1); return nil })
		for i := 0; i < 100000; i++ {
			if err := workflow.Sleep(wctx, "tick-"+itoa(i), 0); err != nil {
				return 0, err
			}
		}
		return 0, nil
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	b.waitFor("some ticks", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1`, h.ID) >= 20
	})
	if err := workflow.Cancel(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("want cancelled, got %v", err)
	}
	if undone.Load() != 1 {
		t.Fatalf("compensation ran %d times", undone.Load())
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
