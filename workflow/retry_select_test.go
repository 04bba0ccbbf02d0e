package workflow_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// A Select that consumed a signal is never dropped by Retry, as a signal
// wait is not: the signal went with it. Here a step fails, the run waits
// in a Select for an approval (consumed), then returns the step's error.
// Retry dropped the Select with the failed step, and the retried run
// waited for an approval that was gone, for ever. Now the Select is kept,
// and with it (as for a StepTx after the failed step) the failed step: the
// run replays to the same error at once, its approval still the one it
// consumed.
func TestRetryKeepsASelectThatConsumedASignal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var fail atomic.Bool
	fail.Store(true)
	wf := workflow.MustRegister(b.reg, "select-then-fail", func(wctx workflow.Context, _ int) (int, error) {
		_, errA := workflow.Step(wctx, "a", func(ctx context.Context) (int, error) {
			if fail.Load() {
				return 0, core.Permanent(errors.New("a failed"))
			}
			return 1, nil
		}, nil)
		approve := workflow.OnSignal[int]("approve")
		if _, err := workflow.Select(wctx, "choose", approve); err != nil {
			return 0, err
		}
		if errA != nil {
			return 0, errA
		}
		return approve.Payload(), nil
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	if err := workflow.Signal(ctx, b.pool, h.ID, "approve", 7); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("want failed, got %v", err)
	}
	fail.Store(false)
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	_, err := result[int](t, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "a failed") {
		t.Fatalf("after Retry the run ended %v; want it failed again by the kept step, not waiting", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND kind = 'select' AND state = 'completed' AND output->>'payload' = '7'`, h.ID); n != 1 {
		t.Fatal("the Select and the approval it consumed are gone from history")
	}
}
