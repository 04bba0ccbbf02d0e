package workflow_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// Saga: every registered compensation runs, newest first, even when one
// fails for good; the run ends failed, its error naming the failed
// compensation. Retry runs only the failed compensation again.
func TestEveryCompensationRunsWhenOneFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	var order []string
	var calls [3]atomic.Int32
	wf := workflow.MustRegister(b.reg, "three-undos", func(wctx workflow.Context, _ int) (int, error) {
		for i, name := range []string{"a", "b", "c"} {
			if _, err := workflow.Step(wctx, name, func(ctx context.Context) (int, error) { return i, nil }, nil); err != nil {
				return 0, err
			}
			workflow.Compensate(wctx, "undo-"+name, func(ctx context.Context) error {
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				if calls[i].Add(1) == 1 && name == "b" {
					return core.Permanent(errors.New("undo b broken"))
				}
				return nil
			})
		}
		return workflow.Step(wctx, "last", func(ctx context.Context) (int, error) {
			return 0, core.Permanent(errors.New("last step failed"))
		}, nil)
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "saga3"})
	_, err := result[int](t, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), `"compensate:undo-b"`) ||
		!strings.Contains(err.Error(), "undo b broken") || !strings.Contains(err.Error(), "last step failed") ||
		!strings.Contains(err.Error(), "1 compensation(s) failed") {
		t.Fatalf("want failed, naming compensate:undo-b and the cause, got %v", err)
	}
	mu.Lock()
	got := strings.Join(order, ",")
	mu.Unlock()
	if got != "c,b,a" {
		t.Fatalf("compensations ran %v, want c,b,a", got)
	}
	run, err := workflow.Get(ctx, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, s := range run.Steps {
		states[s.Key] = s.State
	}
	if states["compensate:undo-a"] != "completed" || states["compensate:undo-b"] != "failed" || states["compensate:undo-c"] != "completed" {
		t.Fatalf("compensation steps %v", states)
	}
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunCompensated) {
		t.Fatalf("after retry: want compensated, got %v", err)
	}
	if calls[0].Load() != 1 || calls[1].Load() != 2 || calls[2].Load() != 1 {
		t.Fatalf("undo calls a=%d b=%d c=%d, want 1 2 1", calls[0].Load(), calls[1].Load(), calls[2].Load())
	}
}
