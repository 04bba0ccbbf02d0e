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

// A parent deleted and started again under its id runs its children anew:
// Delete took the old children with it, and the new child step never
// returns the old child's output.
func TestDeletedParentsChildIsNotAdopted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var kidRuns atomic.Int32
	kid := workflow.MustRegister(b.reg, "echo-kid", func(wctx workflow.Context, s string) (string, error) {
		return workflow.Step(wctx, "echo", func(ctx context.Context) (string, error) { kidRuns.Add(1); return "kid got " + s, nil }, nil)
	})
	parent := workflow.MustRegister(b.reg, "echo-parent", func(wctx workflow.Context, s string) (string, error) {
		return workflow.Child(wctx, "c", kid, s, nil).Get(wctx)
	})
	b.start()
	if _, err := workflow.Start(ctx, b.pool, parent, "old", &workflow.StartOpts{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	if out, err := result[string](t, b.pool, "p"); err != nil || out != "kid got old" {
		t.Fatal(out, err)
	}
	if err := workflow.Delete(ctx, b.pool, "p"); err != nil {
		t.Fatal(err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'p/c'`); n != 0 {
		t.Fatalf("the child outlived its deleted parent (%d rows)", n)
	}
	if _, err := workflow.Start(ctx, b.pool, parent, "new", &workflow.StartOpts{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	if out, err := result[string](t, b.pool, "p"); err != nil || out != "kid got new" {
		t.Fatalf("the new parent's child returned %q, %v", out, err)
	}
	if kidRuns.Load() != 2 {
		t.Fatalf("the child's step ran %d times, want 2", kidRuns.Load())
	}
}

// A run that holds a child's id but is not that parent's child (started
// on its own, or a child of another workflow) is never adopted: the child
// step fails with ErrIDInUse, which the workflow handles.
func TestChildIDHeldByAStranger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	nap := workflow.MustRegister(b.reg, "nap-kid", func(wctx workflow.Context, _ string) (string, error) {
		return "", workflow.Sleep(wctx, "long", time.Hour)
	})
	other := workflow.MustRegister(b.reg, "other", func(wctx workflow.Context, _ string) (string, error) { return "other", nil })
	parent := workflow.MustRegister(b.reg, "adopter", func(wctx workflow.Context, _ string) (string, error) {
		var outs []string
		for _, key := range []string{"same-workflow", "other-workflow"} {
			_, err := workflow.Child(wctx, key, nap, "", nil).Get(wctx)
			var ce *workflow.ChildError
			if !errors.Is(err, workflow.ErrIDInUse) || !errors.As(err, &ce) {
				return "", errors.New("want ErrIDInUse, got " + errString(err))
			}
			outs = append(outs, ce.Message)
		}
		return strings.Join(outs, "; "), nil
	})
	b.start()
	if _, err := workflow.Start(ctx, b.pool, nap, "", &workflow.StartOpts{ID: "q/same-workflow"}); err != nil {
		t.Fatal(err)
	}
	if _, err := workflow.Start(ctx, b.pool, other, "", &workflow.StartOpts{ID: "q/other-workflow"}); err != nil {
		t.Fatal(err)
	}
	if _, err := workflow.Start(ctx, b.pool, parent, "", &workflow.StartOpts{ID: "q"}); err != nil {
		t.Fatal(err)
	}
	out, err := result[string](t, b.pool, "q")
	if err != nil {
		t.Fatalf("the parent did not handle the taken ids: %v", err)
	}
	if !strings.Contains(out, "q/same-workflow") || !strings.Contains(out, "not a child of run q") {
		t.Fatalf("error text %q", out)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE parent_id = 'q'`); n != 0 {
		t.Fatalf("%d strangers linked to the parent", n)
	}
	// The parent's end leaves the strangers alone: they are not its children.
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'q/same-workflow' AND NOT cancel_requested AND finished_at IS NULL`); n != 1 {
		t.Fatal("the stranger was cancelled with the parent")
	}
}

// Delete of a parent whose child has not finished (it is being cancelled)
// deletes nothing and says why.
func TestDeleteWaitsForChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `
INSERT INTO relay_workflow_runs (id, workflow, input, queue) VALUES ('d', 'w', 'null', 'default');
INSERT INTO relay_workflow_runs (id, workflow, input, queue, parent_id, parent_position) VALUES ('d/k', 'w', 'null', 'default', 'd', 0);
UPDATE relay_workflow_runs SET state = 'cancelled', error = 'cancelled', finished_at = now() WHERE id = 'd'`); err != nil {
		t.Fatal(err)
	}
	err := workflow.Delete(ctx, b.pool, "d")
	if err == nil || !strings.Contains(err.Error(), "child") {
		t.Fatalf("delete with a child unfinished: %v", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs`); n != 2 {
		t.Fatalf("%d runs left, want 2", n)
	}
}
