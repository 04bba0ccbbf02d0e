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

// Terminate ends a run at once, wherever it is: a run waiting on a signal
// (its compensation registered) ends terminated with the reason, its
// compensation never runs, its job is cancelled, its child waiting on a
// signal is asked to cancel, and a terminated run cannot be terminated,
// cancelled or retried again.
func TestTerminateEndsARunWithoutCompensating(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var undone atomic.Int32
	child := workflow.MustRegister(b.reg, "term-child", func(wctx workflow.Context, _ int) (int, error) {
		_, _, err := workflow.WaitSignal[int](wctx, "never", 0)
		return 0, err
	})
	wf := workflow.MustRegister(b.reg, "term", func(wctx workflow.Context, _ int) (int, error) {
		if _, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "refund", func(ctx context.Context) error { undone.Add(1); return nil })
		f := workflow.Child(wctx, "kid", child, 0, nil)
		_, _, err := workflow.WaitSignal[int](wctx, "never", 0)
		if err != nil {
			return 0, err
		}
		return f.Get(wctx)
	})
	h, err := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "term-1"})
	if err != nil {
		t.Fatal(err)
	}
	b.start()
	b.waitFor("the run and its child to wait", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE kind = 'signal' AND state = 'waiting'`) == 2
	})
	if err := workflow.Terminate(ctx, b.pool, h.ID, "stuck on a bad deploy"); err != nil {
		t.Fatal(err)
	}
	_, err = result[int](t, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunTerminated) || !strings.Contains(err.Error(), "stuck on a bad deploy") {
		t.Fatalf("want a terminated run with its reason, got %v", err)
	}
	if _, err := result[int](t, b.pool, h.ID+"/kid"); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("the child: want cancelled, got %v", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id WHERE r.id = $1 AND j.state = 'cancelled'`, h.ID); n != 1 {
		t.Fatal("the run's job was not cancelled")
	}
	// Nothing executes the run any more: its compensation never ran.
	if undone.Load() != 0 {
		t.Fatalf("a compensation ran %d times", undone.Load())
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key LIKE 'compensate:%'`, h.ID); n != 0 {
		t.Fatal("a compensation step was recorded")
	}
	for name, err := range map[string]error{
		"terminate": workflow.Terminate(ctx, b.pool, h.ID, "again"),
		"cancel":    workflow.Cancel(ctx, b.pool, h.ID),
	} {
		if !errors.Is(err, workflow.ErrRunFinished) || !strings.Contains(err.Error(), "terminated") {
			t.Errorf("%s of a terminated run: %v", name, err)
		}
	}
	if err := workflow.Retry(ctx, b.pool, h.ID); !errors.Is(err, workflow.ErrNotRetryable) {
		t.Errorf("retry of a terminated run: %v", err)
	}
	if err := workflow.Terminate(ctx, b.pool, "nobody", ""); !errors.Is(err, workflow.ErrRunNotFound) {
		t.Errorf("unknown run: %v", err)
	}
}

// A run terminated while its step runs: the step's context is cancelled
// (the job's cancel reaches its worker), and nothing it returns is
// checkpointed; the run stays terminated.
func TestTerminateDuringAStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	started := make(chan struct{})
	var stopped atomic.Bool
	wf := workflow.MustRegister(b.reg, "term-step", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "slow", func(ctx context.Context) (int, error) {
			close(started)
			select {
			case <-ctx.Done():
				stopped.Store(true)
				return 0, ctx.Err()
			case <-time.After(time.Minute):
				return 1, nil
			}
		}, &workflow.StepOpts{MaxAttempts: 1})
	})
	h, err := workflow.Start(ctx, b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.start()
	<-started
	if err := workflow.Terminate(ctx, b.pool, h.ID, "operator"); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunTerminated) {
		t.Fatalf("want terminated, got %v", err)
	}
	b.waitFor("the step's context to end", stopped.Load)
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1`, h.ID); n != 0 {
		t.Fatalf("%d steps recorded after the terminate", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1 AND state = 'terminated'`, h.ID); n != 1 {
		t.Fatal("the run is no longer terminated")
	}
}

// A reason too long, or not clean text, is refused and nothing changes.
func TestTerminateBadReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "term-bad", func(wctx workflow.Context, _ int) (int, error) { return 1, nil })
	h, err := workflow.Start(ctx, b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, reason := range []string{strings.Repeat("x", workflow.MaxReasonBytes+1), "nul\x00", "\xff"} {
		if err := workflow.Terminate(ctx, b.pool, h.ID, reason); !errors.Is(err, workflow.ErrBadOptions) {
			t.Errorf("reason %.10q: %v", reason, err)
		}
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1 AND state = 'pending'`, h.ID); n != 1 {
		t.Fatal("a refused terminate changed the run")
	}
}
