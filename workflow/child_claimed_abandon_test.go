package workflow_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// An abandoned child (ParentCloseAbandon) is not the parent's to cancel:
// Cancel's tree skips it (relay_workflow_request_cancel), and a child
// started after its parent's cancel runs to its end, however it is
// started. Started by the claimed insert (Child then Get, the cancel
// committed in between), it inherited the parent's cancel_requested
// whatever its policy and was cancelled before its first step, until
// sqlStartChildClaimed left an abandoned child's flag alone.
func TestAbandonedChildStartedAfterItsParentsCancelRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var charged atomic.Int32
	reached, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	kid := workflow.MustRegister(b.reg, "kid", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) { charged.Add(1); return 1, nil }, nil)
	})
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, _ int) (int, error) {
		f := workflow.Child(wctx, "c", kid, 0, &workflow.ChildOpts{ParentClose: workflow.ParentCloseAbandon})
		once.Do(func() { close(reached) })
		select {
		case <-gate:
		case <-wctx.Done():
			return 0, wctx.Err()
		}
		return f.Get(wctx)
	})
	b.startWith(&core.Config{Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	h, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "p"})
	if err != nil {
		t.Fatal(err)
	}
	<-reached
	if err := workflow.Cancel(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	close(gate)
	_, perr := result[int](t, b.pool, h.ID)
	out, cerr := result[int](t, b.pool, "p/c")
	if !errors.Is(perr, workflow.ErrRunCancelled) {
		t.Errorf("parent: want cancelled, got %v", perr)
	}
	if cerr != nil || out != 1 || charged.Load() != 1 {
		t.Errorf("abandoned child: got %d, %v (step ran %d times); want completed 1, as Cancel leaves an abandoned child alone", out, cerr, charged.Load())
	}
}
