package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// nestedSleepers registers top → mid → leaf: leaf sleeps an hour, mid waits
// for leaf, and top waits for mid, returning 1 when mid failed.
func nestedSleepers(b *bundle) *workflow.Workflow[int, int] {
	leaf := workflow.MustRegister(b.reg, "leaf", func(wctx workflow.Context, _ int) (int, error) {
		return 0, workflow.Sleep(wctx, "nap", time.Hour)
	})
	mid := workflow.MustRegister(b.reg, "mid", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Child(wctx, "c", leaf, 0, nil).Get(wctx)
	})
	return workflow.MustRegister(b.reg, "top", func(wctx workflow.Context, _ int) (int, error) {
		_, err := workflow.Child(wctx, "p", mid, 0, nil).Get(wctx)
		var ce *workflow.ChildError
		if !errors.As(err, &ce) || ce.State != workflow.StateFailed {
			return 0, fmt.Errorf("want a failed child, got %v", err)
		}
		return 1, nil
	})
}

// suspendedJob waits until run id's job is queued for later (the run sleeps
// or waits) and returns the job's id.
func (b *bundle) suspendedJob(id string) int64 {
	b.t.Helper()
	b.waitFor(id+" suspended", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs AS r JOIN relay_jobs AS j ON j.id = r.job_id
			WHERE r.id = $1 AND j.state = 'queued' AND j.run_at > now() + interval '10 minutes'`, id) == 1
	})
	var job int64
	if err := b.pool.QueryRow(context.Background(), `SELECT job_id FROM relay_workflow_runs WHERE id = $1`, id).Scan(&job); err != nil {
		b.t.Fatal(err)
	}
	return job
}

// lockWaiters waits until n backends of the test's database wait for a
// lock (on the holder's lock, or queued behind another waiter for it).
func (b *bundle) lockWaiters(n int) {
	b.t.Helper()
	b.waitFor(fmt.Sprintf("%d backends waiting for a lock", n), func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND cardinality(pg_blocking_pids(pid)) > 0`) == n
	})
}

// cancelJobIn cancels job through the core in its own transaction; on a
// superuser connection, with deadlock_timeout set to timeout in that
// transaction (relay_workflow_wake waits half of it).
func cancelJobIn(ctx context.Context, pool *pgxpool.Pool, job int64, timeout string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var super bool
		if err := tx.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil {
			return err
		}
		if super && timeout != "" {
			if _, err := tx.Exec(ctx, `SELECT set_config('deadlock_timeout', $1, true)`, timeout); err != nil {
				return err
			}
		}
		return core.Cancel(ctx, tx, job)
	})
}

// A run's job and its child's ending at once, in two transactions, used to
// deadlock: each transaction held its own job's row, and the trigger
// relay_workflow_job_ended of each asked for the other's run row (to ask
// the child to cancel) or job row (to wake the parent). PostgreSQL aborted
// one (40P01). Here a third transaction holds the child's run row until
// both have reached it, so they meet every time, in either order. Neither
// may fail, both runs end failed, and the grandparent waiting for the
// parent is woken and sees it failed.
func TestWorkflowJobsEndingAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	top := nestedSleepers(b)
	b.start()
	for i := range 6 {
		h, err := workflow.Start(ctx, b.pool, top, 0, &workflow.StartOpts{ID: fmt.Sprintf("g%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		mid, leaf := h.ID+"/p", h.ID+"/p/c"
		leafJob := b.suspendedJob(leaf)
		midJob := b.suspendedJob(mid)
		b.suspendedJob(h.ID)

		holder, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback(ctx) //nolint:errcheck // committed below unless the test failed
		if _, err := holder.Exec(ctx, `SELECT 1 FROM relay_workflow_runs WHERE id = $1 FOR NO KEY UPDATE`, leaf); err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2)
		for _, job := range []int64{midJob, leafJob} {
			go func() { errs <- cancelJobIn(ctx, b.pool, job, "2s") }()
		}
		b.lockWaiters(2)
		if err := holder.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: ending the jobs: %v", i, err)
			}
		}
		for _, id := range []string{mid, leaf} {
			if _, err := result[int](t, b.pool, id); !errors.Is(err, workflow.ErrRunFailed) {
				t.Fatalf("round %d: %s: want failed, got %v", i, id, err)
			}
		}
		if out, err := result[int](t, b.pool, h.ID); err != nil || out != 1 {
			t.Fatalf("round %d: grandparent: %v %v", i, out, err)
		}
	}
}

// The wake-up of a parent whose job's row another transaction holds (here
// one standing for a heartbeat, a claim or a caller's open transaction)
// does not wait for it: the transaction ending the child commits while the
// row is still held, and the wake-up, handed off, is made once the holder
// ends; the parent executes and sees its child failed.
func TestWorkflowWakeStepsOverAHeldRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	top := nestedSleepers(b)
	b.start()
	h, err := workflow.Start(ctx, b.pool, top, 0, &workflow.StartOpts{ID: "g"})
	if err != nil {
		t.Fatal(err)
	}
	midJob := b.suspendedJob(h.ID + "/p")
	b.suspendedJob(h.ID + "/p/c")
	topJob := b.suspendedJob(h.ID)

	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck // committed below unless the test failed
	if _, err := holder.Exec(ctx, `SELECT 1 FROM relay_jobs WHERE id = $1 FOR UPDATE`, topJob); err != nil {
		t.Fatal(err)
	}
	// Ending the mid run's job wakes the grandparent's: it returns while
	// the holder is still open (cancelJobIn's deadline is 2 minutes; the
	// old wake-up waited for the holder, and this hung until then).
	if err := cancelJobIn(ctx, b.pool, midJob, ""); err != nil {
		t.Fatal(err)
	}
	if n := b.count(`SELECT count(*) FROM relay_job_rewake WHERE job_id = $1`, topJob); n != 1 {
		t.Fatalf("want the held wake-up handed off once, found %d", n)
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Woken once the holder ended (the hand-off loop's next run at the
	// latest), not in an hour: the grandparent executes and sees the
	// failure.
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 1 {
		t.Fatalf("grandparent: %v %v", out, err)
	}
}

// workflow.Cancel of a run, at the moment its child's job ends, used to
// deadlock: the cancel held the tree's run rows and waited for the child's
// job row (core.Wake), which the transaction ending that job held while it
// waited for the child's run row. A third transaction holds the child's run
// row until both have reached it, so they meet every time; when the cancel
// gets it first, the old wake-up deadlocked. Neither may fail: the child
// ends failed (its job ended), the parent ends.
func TestCancelWhileAChildJobEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	leaf := workflow.MustRegister(b.reg, "leaf", func(wctx workflow.Context, _ int) (int, error) {
		return 0, workflow.Sleep(wctx, "nap", time.Hour)
	})
	mid := workflow.MustRegister(b.reg, "mid", func(wctx workflow.Context, _ int) (int, error) {
		// On a queue of its own: the parent suspends while the child runs
		// (a child on its parent's queue runs in the parent's slot).
		return workflow.Child(wctx, "c", leaf, 0, &workflow.ChildOpts{Queue: "leaf"}).Get(wctx)
	})
	b.start(core.DefaultQueue, "leaf")
	for i := range 6 {
		h, err := workflow.Start(ctx, b.pool, mid, 0, &workflow.StartOpts{ID: fmt.Sprintf("m%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		child := h.ID + "/c"
		childJob := b.suspendedJob(child)
		b.suspendedJob(h.ID)
		holder, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback(ctx) //nolint:errcheck // committed below unless the test failed
		if _, err := holder.Exec(ctx, `SELECT 1 FROM relay_workflow_runs WHERE id = $1 FOR NO KEY UPDATE`, child); err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2)
		go func() { errs <- cancelJobIn(ctx, b.pool, childJob, "2s") }()
		go func() {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			errs <- pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				var super bool
				if err := tx.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil {
					return err
				}
				if super {
					if _, err := tx.Exec(ctx, `SELECT set_config('deadlock_timeout', '2s', true)`); err != nil {
						return err
					}
				}
				return workflow.Cancel(ctx, tx, h.ID)
			})
		}()
		b.lockWaiters(2)
		if err := holder.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
		if _, err := result[int](t, b.pool, child); !errors.Is(err, workflow.ErrRunFailed) {
			t.Fatalf("round %d: child: want failed, got %v", i, err)
		}
		if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) && !errors.Is(err, workflow.ErrRunCancelled) {
			t.Fatalf("round %d: parent: want failed or cancelled, got %v", i, err)
		}
	}
}

// A child run's end, at the moment its parent's job ends, used to
// deadlock: the child's end held its run row and woke the parent's job
// (core.Wake), whose row the transaction ending that job held while it
// waited for the child's run row (to ask it to cancel). A third
// transaction holds the child's run row until both have reached it; when
// the child's end gets it first, the old wake-up deadlocked. Neither may
// fail: the parent ends failed, the child ends, and its execution was not
// aborted (its job has no error).
func TestChildEndWhileParentJobEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	release := map[string]chan struct{}{}
	gate := func(id string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if release[id] == nil {
			release[id] = make(chan struct{})
		}
		return release[id]
	}
	leaf := workflow.MustRegister(b.reg, "gated", func(wctx workflow.Context, _ int) (int, error) {
		select { // outside a step: the run's end is the first write after it
		case <-gate(wctx.RunID()):
		case <-wctx.Done():
			return 0, wctx.Err()
		}
		return 1, nil
	})
	mid := workflow.MustRegister(b.reg, "mid", func(wctx workflow.Context, _ int) (int, error) {
		// On a queue of its own: the parent suspends while the child runs
		// (a child on its parent's queue runs in the parent's slot).
		return workflow.Child(wctx, "c", leaf, 0, &workflow.ChildOpts{Queue: "leaf"}).Get(wctx)
	})
	b.start(core.DefaultQueue, "leaf")
	for i := range 6 {
		h, err := workflow.Start(ctx, b.pool, mid, 0, &workflow.StartOpts{ID: fmt.Sprintf("m%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		child := h.ID + "/c"
		parentJob := b.suspendedJob(h.ID)
		b.waitFor("the child running", func() bool {
			return b.count(`SELECT count(*) FROM relay_workflow_runs AS r JOIN relay_jobs AS j ON j.id = r.job_id
				WHERE r.id = $1 AND j.state = 'claimed'`, child) == 1
		})
		holder, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback(ctx) //nolint:errcheck // committed below unless the test failed
		if _, err := holder.Exec(ctx, `SELECT 1 FROM relay_workflow_runs WHERE id = $1 FOR NO KEY UPDATE`, child); err != nil {
			t.Fatal(err)
		}
		close(gate(child))
		errs := make(chan error, 1)
		go func() { errs <- cancelJobIn(ctx, b.pool, parentJob, "2s") }()
		b.lockWaiters(2)
		if err := holder.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-errs; err != nil {
			t.Fatalf("round %d: ending the parent's job: %v", i, err)
		}
		if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
			t.Fatalf("round %d: parent: want failed, got %v", i, err)
		}
		if _, err := result[int](t, b.pool, child); err != nil && !errors.Is(err, workflow.ErrRunCancelled) {
			t.Fatalf("round %d: child: want completed or cancelled, got %v", i, err)
		}
		var lastErr string
		if err := b.pool.QueryRow(ctx, `SELECT coalesce(j.last_error, '') FROM relay_jobs AS j JOIN relay_workflow_runs AS r ON r.job_id = j.id
			WHERE r.id = $1`, child).Scan(&lastErr); err != nil {
			t.Fatal(err)
		}
		if lastErr != "" {
			t.Fatalf("round %d: the child's execution failed: %s", i, lastErr)
		}
	}
}
