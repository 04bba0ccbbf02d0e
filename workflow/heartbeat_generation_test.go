package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// A run continued as new starts its steps afresh: the first attempt of a
// step in the new generation finds no heartbeat details, although the same
// step (same key, same position) of the generation before heartbeat. A
// loop that heartbeats a cursor and continues as new per batch would
// otherwise resume each batch from the last one's cursor and skip it.
func TestHeartbeatDetailsDoNotCrossContinueAsNew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "batches", func(wctx workflow.Context, gen int) (string, error) {
		found, err := workflow.Step(wctx, "batch", func(ctx context.Context) (string, error) {
			cursor, ok, err := workflow.HeartbeatDetails[int](ctx)
			if err != nil {
				return "", err
			}
			if err := workflow.Heartbeat(ctx, 100+gen); err != nil {
				return "", err
			}
			return fmt.Sprint(ok, cursor), nil
		}, nil)
		if err != nil {
			return "", err
		}
		if gen == 0 {
			return "", workflow.ContinueAsNew(wctx, 1)
		}
		return found, nil
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	out, err := result[string](t, b.pool, h.ID)
	if err != nil || out != "false 0" {
		t.Fatalf("the second generation's first attempt found %q, %v; want no details (false 0)", out, err)
	}
}

// A step that Retry drops and runs again is a new step: its first attempt
// finds no details of the dropped one's attempts, and its Heartbeat is not
// refused as older than theirs (it counts its attempts from 1 again).
func TestHeartbeatAfterRetryOfTheFailedStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var fail atomic.Bool
	fail.Store(true)
	wf := workflow.MustRegister(b.reg, "beats-then-fails", func(wctx workflow.Context, _ int) (string, error) {
		return workflow.Step(wctx, "work", func(ctx context.Context) (string, error) {
			_, ok, err := workflow.HeartbeatDetails[int](ctx)
			if err != nil {
				return "", err
			}
			if err := workflow.Heartbeat(ctx, 1); err != nil {
				return "", core.Permanent(err)
			}
			if fail.Load() {
				return "", errors.New("failed after its heartbeat")
			}
			return fmt.Sprint(ok), nil
		}, &workflow.StepOpts{MaxAttempts: 2, Retry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	if _, err := result[string](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "failed after its heartbeat") {
		t.Fatalf("want failed by the step, got %v", err)
	}
	fail.Store(false)
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := result[string](t, b.pool, h.ID); err != nil || out != "false" {
		t.Fatalf("after Retry the run ended %q, %v; want the step run anew (no details found, its heartbeat taken)", out, err)
	}
}
