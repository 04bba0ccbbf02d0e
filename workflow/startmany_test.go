package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/workflow"
)

// StartMany starts every run in one call, their handles in order; Results
// waits for all of them; a second StartMany of the same ids starts nothing
// and reports every handle Existing.
func TestStartMany(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	double := workflow.MustRegister(b.reg, "double", func(wctx workflow.Context, n int) (int, error) {
		return workflow.Step(wctx, "x2", func(context.Context) (int, error) { return 2 * n, nil }, nil)
	})
	const n = 300
	runs := make([]workflow.StartParams[int], n)
	for i := range runs {
		runs[i] = workflow.StartParams[int]{Input: i}
		if i%3 == 0 {
			runs[i].Opts = &workflow.StartOpts{ID: fmt.Sprintf("d-%d", i), Tags: []string{"batch:1"}}
		}
	}
	hs, err := workflow.StartMany(ctx, b.pool, double, runs)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != n || hs[3].ID != "d-3" || hs[0].Existing {
		t.Fatalf("handles: %d, [3] %+v", len(hs), hs[3])
	}
	if got := b.count(`SELECT count(*) FROM relay_workflow_runs r JOIN relay_jobs j ON j.id = r.job_id`); got != n {
		t.Fatalf("%d runs with their job, want %d", got, n)
	}
	if got := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE 'batch:1' = ANY(tags)`); got != n/3 {
		t.Fatalf("%d tagged runs, want %d", got, n/3)
	}
	b.start()
	res, err := workflow.Results(ctx, b.pool, hs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.Output != 2*i || r.ID != hs[i].ID {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	again, err := workflow.StartMany(ctx, b.pool, double, runs[:6])
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range again {
		if want := i%3 == 0; h.Existing != want {
			t.Errorf("again %d (%s): Existing %v, want %v", i, h.ID, h.Existing, want)
		}
	}
	if got := b.count(`SELECT count(*) FROM relay_workflow_runs`); got != n+4 {
		t.Errorf("%d runs after starting 2 existing ids and 4 random ones again, want %d", got, n+4)
	}
}

// A bad run fails the whole call, naming it, and nothing is written: bad
// options, a duplicate id in the batch, an id held by another workflow
// (found by the statement, rolled back with the rest); a rolled-back
// transaction leaves no run.
func TestStartManyRefusals(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	one := workflow.MustRegister(b.reg, "one", func(wctx workflow.Context, n int) (int, error) { return n, nil })
	other := workflow.MustRegister(b.reg, "other", func(wctx workflow.Context, n int) (int, error) { return n, nil })
	if _, err := workflow.Start(ctx, b.pool, other, 0, &workflow.StartOpts{ID: "taken"}); err != nil {
		t.Fatal(err)
	}
	ok := workflow.StartParams[int]{}
	for _, c := range []struct {
		runs []workflow.StartParams[int]
		want string
		is   error
	}{
		{[]workflow.StartParams[int]{ok, ok, {Opts: &workflow.StartOpts{Tags: []string{""}}}}, "run 3 of 3", workflow.ErrInvalidTag},
		{[]workflow.StartParams[int]{ok, {Opts: &workflow.StartOpts{Priority: -1}}}, "run 2 of 2", nil},
		{[]workflow.StartParams[int]{{Opts: &workflow.StartOpts{ID: "x"}}, ok, {Opts: &workflow.StartOpts{ID: "x"}}}, `run id "x" is also run 1's`, nil},
		{[]workflow.StartParams[int]{ok, {Opts: &workflow.StartOpts{ID: "taken"}}, ok}, `run taken is a run of "other"`, workflow.ErrIDInUse},
		{make([]workflow.StartParams[int], workflow.MaxStartMany+1), "at most 10000", nil},
	} {
		_, err := workflow.StartMany(ctx, b.pool, one, c.runs)
		if err == nil || !strings.Contains(err.Error(), c.want) || (c.is != nil && !errors.Is(err, c.is)) {
			t.Errorf("StartMany: %v, want an error saying %q", err, c.want)
		}
		if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE workflow = 'one'`); n != 0 {
			t.Fatalf("%d runs written by a refused StartMany (%q)", n, c.want)
		}
		if n := b.count(`SELECT count(*) FROM relay_jobs`); n != 1 {
			t.Fatalf("%d jobs after a refused StartMany (%q), want other's one", n, c.want)
		}
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := workflow.StartMany(ctx, tx, one, []workflow.StartParams[int]{ok, ok}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE workflow = 'one'`); n != 0 {
		t.Fatalf("%d runs after a rollback", n)
	}
}

// Results returns each run's own outcome (an output, a *RunError, a run
// that does not exist) and, when ctx ends first, the runs still running
// with ctx's error.
func TestResultsOfMany(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wf := workflow.MustRegister(b.reg, "mixed", func(wctx workflow.Context, n int) (int, error) {
		switch n {
		case 1:
			return 0, errors.New("one fails")
		case 2:
			_, _, err := workflow.WaitSignal[int](wctx, "never", 0)
			return 0, err
		}
		return n, nil
	})
	hs, err := workflow.StartMany(ctx, b.pool, wf, []workflow.StartParams[int]{{Input: 0}, {Input: 1}, {Input: 3}})
	if err != nil {
		t.Fatal(err)
	}
	b.start()
	hs = append(hs, workflow.Handle[int]{ID: "no-such-run"})
	res, err := workflow.Results(ctx, b.pool, hs)
	if err != nil {
		t.Fatal(err)
	}
	var re *workflow.RunError
	if res[0].Output != 0 || res[0].Err != nil || !errors.As(res[1].Err, &re) || !errors.Is(res[1].Err, workflow.ErrRunFailed) ||
		res[2].Output != 3 || !errors.Is(res[3].Err, workflow.ErrRunNotFound) {
		t.Fatalf("results %+v", res)
	}
	waiting, err := workflow.Start(ctx, b.pool, wf, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	res, err = workflow.Results(short, b.pool, []workflow.Handle[int]{hs[2], waiting})
	if !errors.Is(err, context.DeadlineExceeded) || res[0].Output != 3 || !errors.Is(res[1].Err, context.DeadlineExceeded) {
		t.Fatalf("results past the deadline: %+v, %v", res, err)
	}
}
