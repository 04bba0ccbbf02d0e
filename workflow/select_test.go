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

// A select's choice is checkpointed: the execution that chose "confirm"
// loses its lease before its next checkpoint, "refund" (listed first) has
// arrived meanwhile, and the rescued execution still takes the "confirm"
// branch. The refund signal stays in the mailbox, unconsumed.
func TestSelectReplaysItsChoiceAfterALostLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var killed atomic.Bool
	var branches atomic.Int32
	wf := workflow.MustRegister(b.reg, "select-kill", func(wctx workflow.Context, _ int) (string, error) {
		refund := workflow.OnSignal[string]("refund")
		confirm := workflow.OnSignal[string]("confirm")
		i, err := workflow.Select(wctx, "await", refund, workflow.OnTimer(time.Hour), confirm)
		if err != nil {
			return "", err
		}
		return workflow.Step(wctx, "act", func(ctx context.Context) (string, error) {
			branches.Add(1)
			if !killed.Swap(true) {
				// Decided and checkpointed; the worker dies before the
				// step's checkpoint, after the first-listed case became
				// ready.
				if err := workflow.Signal(ctx, b.pool, wctx.RunID(), "refund", "r1"); err != nil {
					return "", err
				}
				b.rescueNow(wctx.RunID())
				return "", errors.New("killed")
			}
			return fmt.Sprintf("case %d: %s/%s", i, confirm.Payload(), refund.Payload()), nil
		}, nil)
	})
	h, err := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "sel-kill"})
	if err != nil {
		t.Fatal(err)
	}
	b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond})
	b.waitFor("the select to wait", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND kind = 'select' AND state = 'waiting'`, h.ID) == 1
	})
	if err := workflow.Signal(ctx, b.pool, h.ID, "confirm", "c1"); err != nil {
		t.Fatal(err)
	}
	out, err := result[string](t, b.pool, h.ID)
	if err != nil || out != "case 2: c1/" {
		t.Fatalf("got %q, %v; want the confirm branch on the replay", out, err)
	}
	if branches.Load() != 2 {
		t.Fatalf("the step ran %d times, want 2 (killed once)", branches.Load())
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_signals WHERE run_id = $1 AND name = 'refund' AND consumed_at IS NULL`, h.ID); n != 1 {
		t.Fatalf("%d unconsumed refund signals, want 1: a branch not taken leaves its signal", n)
	}
}

// A timer case wins when nothing else comes, on the database's clock
// checkpointed at the first reach; a child case wins when its child ends
// first; a step case when its step returns first. Each is the same on the
// run's later executions (the sleep after each select replays it).
func TestSelectCases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	quick := workflow.MustRegister(b.reg, "select-quick-child", func(wctx workflow.Context, n int) (int, error) {
		return n * 2, nil
	})
	wf := workflow.MustRegister(b.reg, "select-cases", func(wctx workflow.Context, _ int) ([]int, error) {
		var got []int
		// Nothing but a timer: it passes.
		i, err := workflow.Select(wctx, "timer", workflow.OnSignal[int]("never"), workflow.OnTimer(50*time.Millisecond))
		if err != nil {
			return nil, err
		}
		got = append(got, i)
		// A child that ends before a long timer.
		f := workflow.Child(wctx, "child", quick, 21, nil)
		i, err = workflow.Select(wctx, "child-or-timer", workflow.OnTimer(time.Hour), workflow.OnChild(f))
		if err != nil {
			return nil, err
		}
		v, err := f.Get(wctx)
		if err != nil {
			return nil, err
		}
		got = append(got, i, v)
		// A step started by Go, running in this execution.
		sf := workflow.Go(wctx, "go", func(ctx context.Context) (int, error) { return 7, nil }, nil)
		i, err = workflow.Select(wctx, "step-or-signal", workflow.OnSignal[int]("never"), workflow.OnStep(sf))
		if err != nil {
			return nil, err
		}
		s, err := sf.Get(wctx)
		if err != nil {
			return nil, err
		}
		got = append(got, i, s)
		// A later execution replays every choice above.
		if err := workflow.Sleep(wctx, "nap", time.Millisecond); err != nil {
			return nil, err
		}
		return got, nil
	})
	h, err := workflow.Start(ctx, b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.start()
	out, err := result[[]int](t, b.pool, h.ID)
	if err != nil || fmt.Sprint(out) != "[1 1 42 1 7]" {
		t.Fatalf("got %v, %v", out, err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND kind = 'select' AND state = 'completed'`, h.ID); n != 3 {
		t.Fatalf("%d selects checkpointed, want 3", n)
	}
}

// Bad cases are a clear error, returned at the call, with nothing
// recorded: no cases, a nil case, a timer of 0 or less, an empty signal
// name.
func TestSelectBadCases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var nilFuture *workflow.ChildFuture[int]
	wf := workflow.MustRegister(b.reg, "select-bad", func(wctx workflow.Context, _ int) ([]string, error) {
		var errs []string
		for _, cases := range [][]workflow.Case{
			nil,
			{workflow.OnChild(nilFuture)},
			{workflow.OnTimer(0)},
			{workflow.OnTimer(-time.Second)},
			{workflow.OnSignal[int]("")},
		} {
			_, err := workflow.Select(wctx, "bad", cases...)
			if !errors.Is(err, workflow.ErrBadOptions) {
				return nil, fmt.Errorf("want ErrBadOptions, got %v", err)
			}
			errs = append(errs, err.Error())
		}
		return errs, nil
	})
	h, err := workflow.Start(ctx, b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.start()
	out, err := result[[]string](t, b.pool, h.ID)
	if err != nil || len(out) != 5 {
		t.Fatalf("got %v, %v", out, err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1`, h.ID); n != 0 {
		t.Fatalf("%d steps recorded by bad selects", n)
	}
}
