package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// longSteps runs n no-op steps keyed prefix0 … prefix(n-1), each returning
// its index, and returns their sum.
func longSteps(wctx workflow.Context, prefix string, n int) (int, error) {
	sum := 0
	for i := range n {
		v, err := workflow.Step(wctx, fmt.Sprintf("%s%d", prefix, i), func(context.Context) (int, error) { return i, nil }, nil)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// A run executed again by the registry that suspended it reads only the
// steps it did not already hold, and replays the rest from what it kept:
// the outputs are the recorded ones.
func TestResumedRunReadsOnlyNewSteps(t *testing.T) {
	b := setup(t)
	wf := workflow.MustRegister(b.reg, "long-history", func(wctx workflow.Context, _ int) (int, error) {
		sum, err := longSteps(wctx, "s", 100)
		if err != nil {
			return 0, err
		}
		if err := workflow.Sleep(wctx, "z1", 0); err != nil {
			return 0, err
		}
		v, err := workflow.Step(wctx, "after1", func(context.Context) (int, error) { return 1000, nil }, nil)
		if err != nil {
			return 0, err
		}
		if err := workflow.Sleep(wctx, "z2", 0); err != nil {
			return 0, err
		}
		w, err := workflow.Step(wctx, "after2", func(context.Context) (int, error) { return 10000, nil }, nil)
		return sum + v + w, err
	})
	b.start()
	h, err := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := result[int](t, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := 4950 + 1000 + 10000; got != want {
		t.Fatalf("result %d, want %d", got, want)
	}
	st := b.reg.Stats()
	if st.Executions != 3 {
		t.Fatalf("%d executions, want 3 (the test counts the steps each reads)", st.Executions)
	}
	// The first execution reads nothing; the second all 101 steps (the
	// 100 and z1, waiting); the third only from z1 on (z1, after1, z2),
	// not the 100 again.
	if want := int64(101 + 3); st.HistoryRead != want {
		t.Fatalf("the executions read %d history steps, want %d", st.HistoryRead, want)
	}
}

// A run that continued as new is not replayed from the history kept of its
// previous generation: the new generation's steps have other keys, which
// that history would make a nondeterminism error.
func TestKeptHistoryIsNotReplayedInTheNextGeneration(t *testing.T) {
	b := setup(t)
	wf := workflow.MustRegister(b.reg, "generations", func(wctx workflow.Context, gen int) (int, error) {
		sum, err := longSteps(wctx, fmt.Sprintf("g%d-", gen), 100)
		if err != nil {
			return 0, err
		}
		if err := workflow.Sleep(wctx, "z", 0); err != nil {
			return 0, err
		}
		if gen == 0 {
			return 0, workflow.ContinueAsNew(wctx, 1)
		}
		return sum, nil
	})
	b.start()
	h, err := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := result[int](t, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got != 4950 {
		t.Fatalf("result %d, want 4950", got)
	}
}

// A run that another process failed, and that was retried (which drops the
// failed step and those after it), is not replayed from the history this
// registry kept when it suspended the run before: the dropped step, failed
// in that history, runs again.
func TestKeptHistoryIsNotReplayedAfterARetryElsewhere(t *testing.T) {
	a := setup(t)
	other := &bundle{t: t, pool: a.pool, reg: workflow.NewRegistry(a.pool, &workflow.Config{ // another process
		ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 }),
	})}
	var fail atomic.Bool
	fail.Store(true)
	var xRuns atomic.Int32
	fn := func(wctx workflow.Context, _ int) (int, error) {
		sum, err := longSteps(wctx, "s", 80)
		if err != nil {
			return 0, err
		}
		_, xerr := workflow.Step(wctx, "x", func(context.Context) (int, error) {
			xRuns.Add(1)
			if fail.Load() {
				return 0, core.Permanent(errors.New("x fails"))
			}
			return 0, nil
		}, nil)
		if err := workflow.Sleep(wctx, "z1", 0); err != nil {
			return 0, err
		}
		nap := time.Duration(0)
		if fail.Load() {
			nap = time.Hour // woken by hand below
		}
		if err := workflow.Sleep(wctx, "z2", nap); err != nil {
			return 0, err
		}
		if xerr != nil {
			return 0, xerr
		}
		return sum, nil
	}
	wf := workflow.MustRegister(a.reg, "retried-elsewhere", fn)
	workflow.MustRegister(other.reg, "retried-elsewhere", fn)
	ctx := context.Background()
	ca := a.start()
	h, err := workflow.Start(ctx, a.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	// a's second execution loads the 80 steps and the failed x, and
	// suspends in z2, keeping them.
	job := a.suspendedJob(h.ID)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ca.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	if a.reg.Stats().Suspended < 2 {
		t.Fatalf("a suspended the run %d times, want 2", a.reg.Stats().Suspended)
	}
	if _, err := a.pool.Exec(ctx, `UPDATE relay_workflow_steps SET wake_at = now() WHERE run_id = $1 AND key = 'z2'`, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.pool.Exec(ctx, `UPDATE relay_jobs SET run_at = now() WHERE id = $1`, job); err != nil {
		t.Fatal(err)
	}
	co := other.start()
	if _, err := result[int](t, a.pool, h.ID); err == nil {
		t.Fatal("the run completed; want it failed by x")
	}
	if err := co.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	fail.Store(false)
	if err := workflow.Retry(ctx, a.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	a.start()
	got, err := result[int](t, a.pool, h.ID)
	if err != nil {
		t.Fatalf("after the retry: %v (replayed the failed x kept from before?)", err)
	}
	if got != 3160 || xRuns.Load() != 2 {
		t.Fatalf("result %d with x run %d times, want 3160 and 2", got, xRuns.Load())
	}
}
