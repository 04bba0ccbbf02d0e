package workflow_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// A parent that ends with three children still waiting closes each per
// its ParentClose: the default cancels it (its compensation runs), an
// abandoned one runs on and completes when signalled, a terminated one
// ends terminated without its compensation. A policy out of range fails
// the parent at its Child call.
func TestParentClosePolicies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	undone := map[string]int{}
	kid := workflow.MustRegister(b.reg, "pc-kid", func(wctx workflow.Context, name string) (string, error) {
		if _, err := workflow.Step(wctx, "work", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		workflow.Compensate(wctx, "undo", func(ctx context.Context) error { mu.Lock(); undone[name]++; mu.Unlock(); return nil })
		v, _, err := workflow.WaitSignal[string](wctx, "go", 0)
		return v, err
	})
	parent := workflow.MustRegister(b.reg, "pc-parent", func(wctx workflow.Context, _ int) (int, error) {
		workflow.Child(wctx, "cancel", kid, "cancel", nil)
		workflow.Child(wctx, "abandon", kid, "abandon", &workflow.ChildOpts{ParentClose: workflow.ParentCloseAbandon})
		workflow.Child(wctx, "terminate", kid, "terminate", &workflow.ChildOpts{ParentClose: workflow.ParentCloseTerminate})
		_, _, err := workflow.WaitSignal[int](wctx, "end", 0)
		return 1, err
	})
	bad := workflow.MustRegister(b.reg, "pc-bad", func(wctx workflow.Context, _ int) (string, error) {
		return workflow.Child(wctx, "x", kid, "x", &workflow.ChildOpts{ParentClose: 7}).Get(wctx)
	})
	b.start()
	h, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "pc"})
	if err != nil {
		t.Fatal(err)
	}
	b.waitFor("the three children to wait", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id LIKE 'pc/%' AND kind = 'signal' AND state = 'waiting'`) == 3
	})
	if err := workflow.Signal(ctx, b.pool, h.ID, "end", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := result[string](t, b.pool, "pc/cancel"); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("the default child: want cancelled, got %v", err)
	}
	if _, err := result[string](t, b.pool, "pc/terminate"); !errors.Is(err, workflow.ErrRunTerminated) {
		t.Fatalf("the terminated child: want terminated, got %v", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'pc/abandon' AND state = 'running' AND NOT cancel_requested`); n != 1 {
		t.Fatal("the abandoned child did not run on")
	}
	if err := workflow.Signal(ctx, b.pool, "pc/abandon", "go", "free"); err != nil {
		t.Fatal(err)
	}
	if out, err := result[string](t, b.pool, "pc/abandon"); err != nil || out != "free" {
		t.Fatalf("the abandoned child: %q %v", out, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if undone["cancel"] != 1 || undone["terminate"] != 0 || undone["abandon"] != 0 {
		t.Fatalf("compensations run: %v; want only the cancelled child's", undone)
	}
	hb, err := workflow.Start(ctx, b.pool, bad, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := result[string](t, b.pool, hb.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("a policy out of range: %v", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1 AND error LIKE '%ParentClose 7%'`, hb.ID); n != 1 {
		t.Fatal("the failed run's error does not name the bad policy")
	}
}

// A run ended by its job's end (the job cancelled behind the workflow
// layer's back, or dead) closes its children per their ParentClose too,
// in the database's trigger: the default child is asked to cancel (its
// compensation runs), a ParentCloseTerminate child is terminated (no
// compensation), an abandoned one runs on. Before the trigger honoured
// ParentCloseTerminate, that child was cancelled and compensated.
func TestParentCloseWhenTheJobEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	undone := map[string]int{}
	kid := workflow.MustRegister(b.reg, "pcj-kid", func(wctx workflow.Context, name string) (string, error) {
		if _, err := workflow.Step(wctx, "work", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		workflow.Compensate(wctx, "undo", func(ctx context.Context) error { mu.Lock(); undone[name]++; mu.Unlock(); return nil })
		v, _, err := workflow.WaitSignal[string](wctx, "go", 0)
		return v, err
	})
	grandkid := workflow.MustRegister(b.reg, "pcj-grandkid", func(wctx workflow.Context, _ int) (string, error) {
		workflow.Compensate(wctx, "undo", func(ctx context.Context) error { mu.Lock(); undone["grandkid"]++; mu.Unlock(); return nil })
		v, _, err := workflow.WaitSignal[string](wctx, "go", 0)
		return v, err
	})
	// A terminated child's own children are closed per their policies:
	// this one's default child is asked to cancel.
	terminated := workflow.MustRegister(b.reg, "pcj-terminated", func(wctx workflow.Context, name string) (string, error) {
		workflow.Compensate(wctx, "undo", func(ctx context.Context) error { mu.Lock(); undone[name]++; mu.Unlock(); return nil })
		workflow.Child(wctx, "grandkid", grandkid, 0, nil)
		v, _, err := workflow.WaitSignal[string](wctx, "go", 0)
		return v, err
	})
	parent := workflow.MustRegister(b.reg, "pcj-parent", func(wctx workflow.Context, _ int) (int, error) {
		workflow.Child(wctx, "cancel", kid, "cancel", nil)
		workflow.Child(wctx, "abandon", kid, "abandon", &workflow.ChildOpts{ParentClose: workflow.ParentCloseAbandon})
		workflow.Child(wctx, "terminate", terminated, "terminate", &workflow.ChildOpts{ParentClose: workflow.ParentCloseTerminate})
		_, _, err := workflow.WaitSignal[int](wctx, "end", 0)
		return 1, err
	})
	b.start()
	h, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "pcj"})
	if err != nil {
		t.Fatal(err)
	}
	b.waitFor("the children and the grandchild to wait", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id LIKE 'pcj/%' AND kind = 'signal' AND state = 'waiting'`) == 4
	})
	var job int64
	if err := b.pool.QueryRow(ctx, `SELECT job_id FROM relay_workflow_runs WHERE id = $1`, h.ID).Scan(&job); err != nil {
		t.Fatal(err)
	}
	if err := core.Cancel(ctx, b.pool, job); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("the parent whose job was cancelled: want failed, got %v", err)
	}
	if _, err := result[string](t, b.pool, "pcj/cancel"); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("the default child: want cancelled, got %v", err)
	}
	if _, err := result[string](t, b.pool, "pcj/terminate"); !errors.Is(err, workflow.ErrRunTerminated) {
		t.Fatalf("the ParentCloseTerminate child: want terminated, got %v", err)
	}
	if _, err := result[string](t, b.pool, "pcj/terminate/grandkid"); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("the terminated child's default child: want cancelled, got %v", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs AS j JOIN relay_workflow_runs AS r ON r.job_id = j.id WHERE r.id = 'pcj/terminate' AND j.state = 'cancelled'`); n != 1 {
		t.Fatal("the terminated child's job was not cancelled")
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'pcj/terminate' AND error LIKE '%pcj%ParentCloseTerminate%'`); n != 1 {
		t.Fatal("the terminated child's error does not name its parent and the policy")
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'pcj/abandon' AND state = 'running' AND NOT cancel_requested`); n != 1 {
		t.Fatal("the abandoned child did not run on")
	}
	if err := workflow.Signal(ctx, b.pool, "pcj/abandon", "go", "free"); err != nil {
		t.Fatal(err)
	}
	if out, err := result[string](t, b.pool, "pcj/abandon"); err != nil || out != "free" {
		t.Fatalf("the abandoned child: %q %v", out, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if undone["cancel"] != 1 || undone["terminate"] != 0 || undone["abandon"] != 0 || undone["grandkid"] != 1 {
		t.Fatalf("compensations run: %v; want the cancelled child's and the grandchild's only", undone)
	}
}
