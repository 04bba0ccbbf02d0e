package workflow_test

import (
	"context"
	"errors"
	"testing"

	"github.com/relayq/relay/workflow"
)

// The id policies, against runs that exist: unfinished (waiting on a
// signal) and finished (completed, failed). The defaults return the run
// that exists; IDConflictFail and IDReuseRefuse return a *RunExistsError
// naming its state; IDConflictTerminateExisting ends the running one (and
// its child) and starts anew; IDReuseAllow starts anew over a finished
// run; IDReuseAllowIfNotCompleted only over one that did not complete. Each new run runs with the new input.
func TestIDPolicies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	kid := workflow.MustRegister(b.reg, "idp-kid", func(wctx workflow.Context, _ int) (int, error) {
		_, _, err := workflow.WaitSignal[int](wctx, "never", 0)
		return 0, err
	})
	wf := workflow.MustRegister(b.reg, "idp", func(wctx workflow.Context, in int) (int, error) {
		switch in {
		case 0: // waits, with a child waiting too
			f := workflow.Child(wctx, "kid", kid, 0, nil)
			v, _, err := workflow.WaitSignal[int](wctx, "go", 0)
			if err != nil {
				return 0, err
			}
			f.Get(wctx) //nolint:errcheck
			return v, nil
		case -1:
			return 0, errors.New("failed on purpose")
		}
		return in, nil
	})
	b.start()
	start := func(id string, in int, o workflow.StartOpts) (workflow.Handle[int], error) {
		t.Helper()
		o.ID = id
		return workflow.Start(ctx, b.pool, wf, in, &o)
	}
	mustStart := func(id string, in int) {
		t.Helper()
		if _, err := start(id, in, workflow.StartOpts{}); err != nil {
			t.Fatal(err)
		}
	}
	mustStart("running", 0)
	mustStart("done", 5)
	mustStart("failed", -1)
	b.waitFor("the runs to settle", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id IN ('done', 'failed') AND finished_at IS NOT NULL`) == 2 &&
			b.count(`SELECT count(*) FROM relay_workflow_steps WHERE kind = 'signal' AND state = 'waiting'`) == 2
	})
	refused := func(what string, err error, state workflow.RunState) {
		t.Helper()
		var re *workflow.RunExistsError
		if !errors.Is(err, workflow.ErrRunExists) || !errors.As(err, &re) || re.State != state {
			t.Fatalf("%s: want a *RunExistsError of state %s, got %v", what, state, err)
		}
	}
	// Defaults: the run that exists.
	for _, id := range []string{"running", "done", "failed"} {
		h, err := start(id, 9, workflow.StartOpts{})
		if err != nil || !h.Existing {
			t.Fatalf("default start of %s: %v %v", id, h, err)
		}
	}
	// Refusals.
	_, err := start("running", 9, workflow.StartOpts{IDConflict: workflow.IDConflictFail})
	refused("IDConflictFail", err, workflow.StateRunning)
	_, err = start("done", 9, workflow.StartOpts{IDReuse: workflow.IDReuseRefuse})
	refused("IDReuseRefuse", err, workflow.StateCompleted)
	_, err = start("done", 9, workflow.StartOpts{IDReuse: workflow.IDReuseAllowIfNotCompleted})
	refused("IDReuseAllowIfNotCompleted over a completed run", err, workflow.StateCompleted)
	// A policy for the other case does not apply.
	if h, err := start("running", 9, workflow.StartOpts{IDReuse: workflow.IDReuseAllow}); err != nil || !h.Existing {
		t.Fatalf("IDReuse on a running run: %v %v", h, err)
	}
	// Starts anew.
	for id, o := range map[string]workflow.StartOpts{
		"running": {IDConflict: workflow.IDConflictTerminateExisting},
		"done":    {IDReuse: workflow.IDReuseAllow},
		"failed":  {IDReuse: workflow.IDReuseAllowIfNotCompleted},
	} {
		h, err := start(id, 7, o)
		if err != nil || h.Existing {
			t.Fatalf("start anew of %s: %v %v", id, h, err)
		}
		if out, err := result[int](t, b.pool, id); err != nil || out != 7 {
			t.Fatalf("new run %s: %d %v", id, out, err)
		}
	}
	// The terminated run's child went with it; the new run has no child.
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'running/kid'`); n != 0 {
		t.Fatalf("the replaced run's child is still there (%d)", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs WHERE kind = 'relay.workflow' AND state = 'cancelled'`); n != 2 {
		t.Fatalf("%d cancelled run jobs, want 2 (the replaced run's and its child's)", n)
	}
	// Out of range.
	for _, o := range []workflow.StartOpts{{IDConflict: 9}, {IDReuse: -1}} {
		if _, err := start("fresh", 1, o); !errors.Is(err, workflow.ErrBadOptions) {
			t.Fatalf("policy out of range %+v: %v", o, err)
		}
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'fresh'`); n != 0 {
		t.Fatal("a refused start wrote a run")
	}
}
