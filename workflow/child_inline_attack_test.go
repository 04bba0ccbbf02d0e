package workflow_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// A cancel committed after a parent started its child, but before the
// child's first execution, is the child's too (Cancel asks the run's
// unfinished children): when the parent then executes the child in its
// own slot, the child starts no step, as a child executed from its queue
// would not (it reads cancel_requested when its execution begins). The
// parent waits in a step between the child's start (which that step's
// call writes: any primitive but the child's Get does) and Get, whose
// checkpoint is deferred, so the parent writes nothing that would see the
// cancel first.
func TestInlineChildSeesACancelCommittedBeforeItRan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var charged atomic.Int32
	gate := make(chan struct{})
	kid := workflow.MustRegister(b.reg, "kid", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) { charged.Add(1); return 1, nil }, nil)
	})
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, _ int) (int, error) {
		f := workflow.Child(wctx, "c", kid, 0, nil)
		if _, err := workflow.Step(wctx, "wait", func(ctx context.Context) (int, error) {
			select {
			case <-gate:
				return 0, nil
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}, nil); err != nil {
			return 0, err
		}
		return f.Get(wctx)
	})
	// One slot: while the parent holds it no fetch loop claims the child.
	b.startWith(&core.Config{Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}, "other": {MaxWorkers: 1}}})
	h, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "p"})
	if err != nil {
		t.Fatal(err)
	}
	b.waitFor("the child started", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'p/c'`) == 1
	})
	if err := workflow.Cancel(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'p/c' AND cancel_requested`); n != 1 {
		t.Fatalf("the child was not asked to cancel with its parent")
	}
	close(gate)
	_, perr := result[int](t, b.pool, h.ID)
	_, cerr := result[int](t, b.pool, "p/c")
	if n := charged.Load(); n != 0 {
		t.Errorf("the child's step ran %d times after the cancel had committed, want 0", n)
	}
	if !errors.Is(cerr, workflow.ErrRunCancelled) {
		t.Errorf("child: want cancelled, got %v", cerr)
	}
	if !errors.Is(perr, workflow.ErrRunCancelled) {
		t.Errorf("parent: want cancelled (a Cancel that returned nil is never lost), got %v", perr)
	}
}

// The parent's lease lost while its child runs in the parent's slot (the
// rescuer moved the parent's job on): the child, fenced by its own job's
// lease, records its StepTx once; the parent's rescued execution collects
// the child's outcome (the child's end wakes it, as the execution that
// lent its slot no longer holds the parent's job), and the run completes.
func TestInlineChildWhenTheParentsLeaseIsLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	createPayments(t, b)
	var runs atomic.Int32
	kid := workflow.MustRegister(b.reg, "kid", func(wctx workflow.Context, amount int) (int, error) {
		return workflow.StepTx(wctx, "charge", func(ctx context.Context, tx pgx.Tx) (int, error) {
			if runs.Add(1) == 1 {
				b.rescueNow("p") // the parent's lease moves on while its child runs in its slot
			}
			_, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1, $2)`, wctx.RunID(), amount)
			return amount, err
		}, nil)
	})
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, amount int) (int, error) {
		return workflow.Child(wctx, "c", kid, amount, nil).Get(wctx)
	})
	b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 2}}})
	h, err := workflow.Start(ctx, b.pool, parent, 7, &workflow.StartOpts{ID: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 7 {
		t.Fatalf("parent: %d %v", out, err)
	}
	if n := b.count(`SELECT count(*) FROM payments`); n != 1 {
		t.Fatalf("%d payments, want exactly 1", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'p/c' AND state = 'completed'`); n != 1 {
		t.Fatal("the child did not complete")
	}
}

// A parent's execution timeout bounds it while it waits for a child on its
// own queue, as for one on another queue: the parent ends at its deadline
// (failed, ErrRunTimedOut) while the child's step still runs, instead of
// waiting in Get, its slot lent to the child, until the child's end.
func TestParentsExecutionTimeoutWhileItsChildRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	release := make(chan struct{})
	kid := workflow.MustRegister(b.reg, "kid", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "slow", func(ctx context.Context) (int, error) {
			select { // a step far longer than the parent's timeout
			case <-release:
			case <-time.After(2 * time.Minute):
			}
			return 1, nil
		}, nil)
	})
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Child(wctx, "c", kid, 0, nil).Get(wctx)
	})
	b.start()
	t.Cleanup(func() { close(release) }) // before the client's Stop
	h, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "p", ExecutionTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = workflow.Result[int](rctx, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), workflow.ErrRunTimedOut.Error()) {
		t.Fatalf("parent: want failed by its execution timeout while its child runs, got %v", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'p/c' AND cancel_requested`); n != 1 {
		t.Fatal("the parent's end did not ask its child to cancel")
	}
}

// A child executed in its parent's slot that waits for a child of its own
// lends that slot on (three generations in one worker slot): each run
// executes once, none suspends, and the outcome climbs back up.
func TestGrandchildExecutedInTheSameSlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	leaf := workflow.MustRegister(b.reg, "leaf", func(wctx workflow.Context, n int) (int, error) {
		return workflow.Step(wctx, "add", func(ctx context.Context) (int, error) { return n + 1, nil }, nil)
	})
	mid := workflow.MustRegister(b.reg, "mid", func(wctx workflow.Context, n int) (int, error) {
		v, err := workflow.Child(wctx, "leaf", leaf, n, nil).Get(wctx)
		return v * 10, err
	})
	top := workflow.MustRegister(b.reg, "top", func(wctx workflow.Context, n int) (int, error) {
		return workflow.Child(wctx, "mid", mid, n, nil).Get(wctx)
	})
	b.startWith(&core.Config{Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	h, err := workflow.Start(ctx, b.pool, top, 4, &workflow.StartOpts{ID: "g"})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 50 {
		t.Fatalf("%d %v", out, err)
	}
	if st := b.reg.Stats(); st.Suspended != 0 || st.Executions != 3 {
		t.Fatalf("stats %+v: want 3 executions, none suspended", st)
	}
	b.waitFor("every job succeeded after one attempt", func() bool {
		return b.count(`SELECT count(*) FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id
			WHERE r.id LIKE 'g%' AND j.state = 'succeeded' AND j.attempt = 1`) == 3
	})
}

// A queue paused between a child's start and its parent's Get holds the
// child: the parent does not execute it in its slot (the pause refuses
// that claim as it refuses a fetch loop's), it suspends, and the child
// runs, waking its parent, once the queue is resumed. The parent waits in
// a step, whose call writes the child's start.
func TestPausedQueueHoldsAnInlineChild(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var ran atomic.Int32
	gate := make(chan struct{})
	kid := workflow.MustRegister(b.reg, "kid", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "work", func(ctx context.Context) (int, error) { ran.Add(1); return 3, nil }, nil)
	})
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, _ int) (int, error) {
		f := workflow.Child(wctx, "c", kid, 0, nil)
		if _, err := workflow.Step(wctx, "wait", func(ctx context.Context) (int, error) {
			select {
			case <-gate:
				return 0, nil
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}, nil); err != nil {
			return 0, err
		}
		return f.Get(wctx)
	})
	// One slot: while the parent holds it no fetch loop claims the child.
	b.startWith(&core.Config{Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	h, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "p"})
	if err != nil {
		t.Fatal(err)
	}
	b.waitFor("the child started", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'p/c'`) == 1
	})
	if _, err := core.PauseQueue(ctx, b.pool, core.DefaultQueue, "test"); err != nil {
		t.Fatal(err)
	}
	close(gate)
	b.waitFor("the parent suspended", func() bool { return b.reg.Stats().Suspended >= 1 })
	if n := ran.Load(); n != 0 {
		t.Fatalf("the child ran %d times on a paused queue", n)
	}
	if _, err := core.ResumeQueue(ctx, b.pool, core.DefaultQueue); err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 3 {
		t.Fatalf("%d %v", out, err)
	}
}
