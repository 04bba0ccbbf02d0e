package workflow_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/workflow"
)

// A Select keeps the promises of the waits it stands for: a Cancel while
// it waits ends the run cancelled with its compensation, none of the
// cases chosen; a signal of the wrong type for its OnSignal case is set
// aside (the run does not fail) and the Select goes on to choose the next
// good one.
func TestSelectUnderCancelAndBadSignals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var undone atomic.Int32
	wf := workflow.MustRegister(b.reg, "selects", func(wctx workflow.Context, _ int) (int, error) {
		if _, err := workflow.Step(wctx, "do", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "undo", func(ctx context.Context) error { undone.Add(1); return nil })
		pick := workflow.OnSignal[int]("pick")
		i, err := workflow.Select(wctx, "choose", pick, workflow.OnTimer(time.Hour))
		if err != nil {
			return 0, err
		}
		if i != 0 {
			return -1, nil
		}
		return pick.Payload(), nil
	})
	b.start()
	waiting := func(id string) {
		b.waitFor("the run waits in its Select", func() bool {
			return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND kind = 'select' AND state = 'waiting'`, id) == 1
		})
	}
	cancelled, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	waiting(cancelled.ID)
	if err := workflow.Cancel(ctx, b.pool, cancelled.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, cancelled.ID); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("cancel during a Select: %v", err)
	}
	if undone.Load() != 1 {
		t.Fatalf("the compensation ran %d times", undone.Load())
	}
	signalled, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	waiting(signalled.ID)
	if err := workflow.Signal(ctx, b.pool, signalled.ID, "pick", "not a number"); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the bad signal set aside", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_signals WHERE run_id = $1 AND decode_error IS NOT NULL`, signalled.ID) == 1
	})
	if err := workflow.Signal(ctx, b.pool, signalled.ID, "pick", 4); err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, b.pool, signalled.ID); err != nil || out != 4 {
		t.Fatalf("after a bad signal the run ended %d, %v; want the good one's 4", out, err)
	}
}
