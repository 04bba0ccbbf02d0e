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
