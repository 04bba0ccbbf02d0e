package workflow_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/workflow"
)

// A run's execution timeout ends it whatever it waits on: a signal wait
// without a timeout (its compensation runs: compensated), an hour's sleep
// and a step retrying without end (nothing to compensate: failed). Each
// ends at its deadline, not when its wait would have, with an error
// starting with ErrRunTimedOut's text.
func TestExecutionTimeoutEndsEveryWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var undone atomic.Int32
	waits := workflow.MustRegister(b.reg, "deadline-wait", func(wctx workflow.Context, _ int) (int, error) {
		if _, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "refund", func(ctx context.Context) error { undone.Add(1); return nil })
		_, _, err := workflow.WaitSignal[int](wctx, "never", 0)
		return 0, err
	})
	sleeps := workflow.MustRegister(b.reg, "deadline-sleep", func(wctx workflow.Context, _ int) (int, error) {
		return 0, workflow.Sleep(wctx, "nap", time.Hour)
	})
	retries := workflow.MustRegister(b.reg, "deadline-retry", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "flaky", func(ctx context.Context) (int, error) { return 0, errors.New("provider down") },
			&workflow.StepOpts{MaxAttempts: 1000})
	})
	b.start()
	timeout := &workflow.StartOpts{ExecutionTimeout: 1500 * time.Millisecond}
	hw, err := workflow.Start(ctx, b.pool, waits, 0, timeout)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := workflow.Start(ctx, b.pool, sleeps, 0, timeout)
	if err != nil {
		t.Fatal(err)
	}
	hr, err := workflow.Start(ctx, b.pool, retries, 0, timeout)
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]error{hw.ID: workflow.ErrRunCompensated, hs.ID: workflow.ErrRunFailed, hr.ID: workflow.ErrRunFailed} {
		_, err := result[int](t, b.pool, id)
		if !errors.Is(err, want) || !strings.Contains(err.Error(), workflow.ErrRunTimedOut.Error()) {
			t.Fatalf("run %s: want %v by its execution timeout, got %v", id, want, err)
		}
		// Ended at its deadline, not before (nor an hour later).
		if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1 AND finished_at >= deadline_at
			AND finished_at < deadline_at + interval '50 seconds'`, id); n != 1 {
			t.Fatalf("run %s did not end at its deadline", id)
		}
	}
	if undone.Load() != 1 {
		t.Fatalf("the compensation ran %d times, want 1", undone.Load())
	}
	// A retried run has no deadline any more.
	if err := workflow.Retry(ctx, b.pool, hs.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1 AND deadline_at IS NULL`, hs.ID); n != 1 {
		t.Fatal("Retry kept the deadline")
	}
	if _, err := workflow.Start(ctx, b.pool, sleeps, 0, &workflow.StartOpts{ExecutionTimeout: -time.Second}); !errors.Is(err, workflow.ErrBadOptions) {
		t.Fatalf("a negative execution timeout: %v", err)
	}
}

// A run of a StartMany with an ExecutionTimeout has its deadline, as a
// Start's; the others none.
func TestStartManyKeepsTheExecutionTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "deadline-many", func(wctx workflow.Context, _ int) (int, error) { return 1, nil })
	if _, err := workflow.StartMany(ctx, b.pool, wf, []workflow.StartParams[int]{
		{Input: 1, Opts: &workflow.StartOpts{ID: "dm-1", ExecutionTimeout: time.Hour}},
		{Input: 2, Opts: &workflow.StartOpts{ID: "dm-2"}},
	}); err != nil {
		t.Fatal(err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'dm-1' AND deadline_at > now() + interval '50 minutes'`); n != 1 {
		t.Fatal("the timed run of the batch has no deadline")
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'dm-2' AND deadline_at IS NULL`); n != 1 {
		t.Fatal("the other run has a deadline")
	}
}
