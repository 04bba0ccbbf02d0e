package workflow_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// A long step with a short timeout makes progress across attempts: each
// attempt reads where the last one got to (HeartbeatDetails), works an
// item at a time and heartbeats after each, so an attempt cut off by its
// timeout redoes at most the item it was on. The step ends with every
// item done, over several attempts. Heartbeat outside a step is
// ErrNotInStep.
func TestHeartbeatDetailsAcrossAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const items = 20
	var worked, attempts atomic.Int32
	wf := workflow.MustRegister(b.reg, "heartbeat", func(wctx workflow.Context, _ int) (int, error) {
		if err := workflow.Heartbeat(wctx, 1); !errors.Is(err, workflow.ErrNotInStep) {
			return 0, errors.New("heartbeat outside a step: want ErrNotInStep")
		}
		return workflow.Step(wctx, "long", func(ctx context.Context) (int, error) {
			attempts.Add(1)
			next, _, err := workflow.HeartbeatDetails[int](ctx)
			if err != nil {
				return 0, err
			}
			for ; next < items; next++ {
				select {
				case <-time.After(25 * time.Millisecond): // one item's work
				case <-ctx.Done():
					return 0, ctx.Err()
				}
				worked.Add(1)
				if err := workflow.Heartbeat(ctx, next+1); err != nil {
					return 0, err
				}
			}
			return next, nil
		}, &workflow.StepOpts{Timeout: 150 * time.Millisecond, MaxAttempts: 100,
			Retry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
	})
	h, err := workflow.Start(ctx, b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.start()
	out, err := result[int](t, b.pool, h.ID)
	if err != nil || out != items {
		t.Fatalf("got %d, %v", out, err)
	}
	n, w := attempts.Load(), worked.Load()
	if n < 2 {
		t.Fatalf("%d attempts: the timeout never cut one off", n)
	}
	if w < items || w > items+n {
		t.Fatalf("%d items worked in %d attempts: each attempt may redo at most the item it was on", w, n)
	}
}

// StepOpts.HeartbeatTimeout fails an attempt that stops heartbeating: the
// first attempt heartbeats once and hangs, fails at the lapse (long before
// its Timeout) and the second completes; a step that never heartbeats and
// has no attempt left fails with an error matching ErrHeartbeatTimeout and
// ErrStepTimeout, on every execution.
func TestHeartbeatTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var tries atomic.Int32
	wf := workflow.MustRegister(b.reg, "heartbeat-timeout", func(wctx workflow.Context, _ int) (string, error) {
		out, err := workflow.Step(wctx, "stalls-once", func(ctx context.Context) (string, error) {
			if tries.Add(1) == 1 {
				if err := workflow.Heartbeat(ctx, "started"); err != nil {
					return "", err
				}
				<-ctx.Done() // stuck: no more heartbeats
				return "", ctx.Err()
			}
			return "done", nil
		}, &workflow.StepOpts{HeartbeatTimeout: 300 * time.Millisecond, Timeout: time.Hour,
			Retry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
		if err != nil {
			return "", err
		}
		_, err = workflow.Step(wctx, "silent", func(ctx context.Context) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		}, &workflow.StepOpts{HeartbeatTimeout: 200 * time.Millisecond, MaxAttempts: 1})
		if !errors.Is(err, workflow.ErrHeartbeatTimeout) || !errors.Is(err, workflow.ErrStepTimeout) {
			return "", errors.New("silent: want ErrHeartbeatTimeout and ErrStepTimeout, got " + err.Error())
		}
		if err := workflow.Sleep(wctx, "replay", time.Millisecond); err != nil { // the next execution replays the errors
			return "", err
		}
		return out, nil
	})
	h, err := workflow.Start(ctx, b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.start()
	if out, err := result[string](t, b.pool, h.ID); err != nil || out != "done" {
		t.Fatalf("got %q, %v", out, err)
	}
	if tries.Load() != 2 {
		t.Fatalf("the stalling step ran %d times, want 2", tries.Load())
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'stalls-once'
		AND attempt_log->0->>'error' LIKE '%no heartbeat for 300ms%'`, h.ID); n != 1 {
		t.Fatal("the first attempt's error is not the heartbeat timeout")
	}
	bad := workflow.MustRegister(b.reg, "heartbeat-bad", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "x", func(ctx context.Context) (int, error) { return 1, nil }, &workflow.StepOpts{HeartbeatTimeout: -1})
	})
	hb, err := workflow.Start(ctx, b.pool, bad, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, hb.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("a negative HeartbeatTimeout: %v", err)
	}
}
