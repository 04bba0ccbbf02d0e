package core_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

func TestCancelAndRequeue(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()

	// Cancel a queued job (in a transaction: nothing until commit).
	queued, _ := core.Enqueue(ctx, pool, echoArgs{}, &core.EnqueueOpts{Delay: time.Hour})
	tx, _ := pool.Begin(ctx)
	if err := core.Cancel(ctx, tx, queued.ID); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	if st := jobState(t, pool, queued.ID); st != core.StateQueued {
		t.Fatalf("rolled-back cancel left state %s", st)
	}
	if err := core.Cancel(ctx, pool, queued.ID); err != nil {
		t.Fatal(err)
	}
	if st := jobState(t, pool, queued.ID); st != core.StateCancelled {
		t.Fatalf("state %s after cancel", st)
	}

	// Cancel a running job: its handler's context is cancelled at once (by
	// notification) and nothing it reports afterwards is recorded.
	ws, started, release, ctxErr := blocking(true)
	c := startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: time.Minute})
	running, _ := core.Enqueue(ctx, pool, blockArgs{}, nil)
	<-started
	if err := core.Cancel(ctx, pool, running.ID); err != nil {
		t.Fatal(err)
	}
	if cause := <-ctxErr; !errors.Is(cause, core.ErrJobCancelled) {
		t.Fatalf("cause %v, want ErrJobCancelled", cause)
	}
	if st := jobState(t, pool, running.ID); st != core.StateCancelled {
		t.Fatalf("running job state %s after cancel", st)
	}

	// Illegal and unknown.
	if err := core.Cancel(ctx, pool, queued.ID); !errors.Is(err, core.ErrIllegalTransition) {
		t.Fatalf("cancel a cancelled job: %v", err)
	}
	if err := core.Cancel(ctx, pool, 999999); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("cancel unknown job: %v", err)
	}
	if _, err := core.JobGet(ctx, pool, 999999); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("get unknown job: %v", err)
	}

	// Requeue the cancelled running job: it runs again, attempts reset,
	// history kept.
	if err := core.Requeue(ctx, pool, running.ID); err != nil {
		t.Fatal(err)
	}
	j := <-started
	if j.ID != running.ID || j.Attempt != 1 {
		t.Fatalf("requeued job ran as %d attempt %d", j.ID, j.Attempt)
	}
	release <- nil
	waitState(t, pool, running.ID, core.StateSucceeded)
	if err := core.Requeue(ctx, pool, running.ID); !errors.Is(err, core.ErrIllegalTransition) {
		t.Fatalf("requeue a succeeded job: %v", err)
	}
	_ = c
}

func TestRequeueDeadJob(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	var fail atomic.Bool
	fail.Store(true)
	done := make(chan struct{}, 1)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		if fail.Load() {
			return errors.New("down")
		}
		done <- struct{}{}
		return nil
	}))
	startClient(t, pool, &core.Config{Workers: ws, Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	res, _ := core.Enqueue(ctx, pool, echoArgs{}, &core.EnqueueOpts{MaxAttempts: 1})
	waitState(t, pool, res.ID, core.StateDead)
	fail.Store(false)
	if err := core.Requeue(ctx, pool, res.ID); err != nil {
		t.Fatal(err)
	}
	<-done
	j := waitState(t, pool, res.ID, core.StateSucceeded)
	if len(j.History) != 1 || j.Attempt != 1 {
		t.Fatalf("requeued dead job: %+v", j)
	}
}

func TestRetention(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	// 35 old succeeded jobs, 3 dead ones, 2 fresh succeeded ones.
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'echo' FROM generate_series(1, 40)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'claimed', lease_token = gen_random_uuid(), lease_expires_at = now()`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = CASE WHEN id <= 37 THEN 'succeeded' ELSE 'dead' END,
		lease_token = NULL, lease_expires_at = NULL, finalized_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET finalized_at = now() WHERE id IN (36, 37)`); err != nil {
		t.Fatal(err)
	}
	c := startClient(t, pool, &core.Config{Retention: core.Retention{
		Succeeded: time.Hour, Dead: -1, Interval: 10 * time.Millisecond, BatchSize: 10,
	}})
	waitFor(t, "old succeeded jobs deleted", func() bool {
		return count(t, pool, "SELECT count(*) FROM relay_jobs WHERE state = 'succeeded'") == 2
	})
	if n := count(t, pool, "SELECT count(*) FROM relay_jobs WHERE state = 'dead'"); n != 3 {
		t.Fatalf("dead jobs kept forever: %d left, want 3", n)
	}
	// Deleted counts a batch just after it commits: the rows can be gone
	// before the last batch is counted.
	waitFor(t, "the deletions counted", func() bool { return c.Stats().Deleted >= 35 })
	if d := c.Stats().Deleted; d != 35 {
		t.Fatalf("deleted %d, want 35", d)
	}
}
