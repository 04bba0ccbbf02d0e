package core_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
	"github.com/relayq/relay/internal/fence"
	"github.com/relayq/relay/testkit/testdb"
)

type snoozeArgs struct{}

func (snoozeArgs) Kind() string { return "snoozer" }

// A snoozed attempt is not counted: a job with one attempt snoozes many
// times and still succeeds, with an empty history.
func TestSnoozeDoesNotSpendAttempts(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	var runs atomic.Int32
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[snoozeArgs](func(ctx context.Context, j *core.Job[snoozeArgs]) error {
		if j.Attempt != 1 {
			t.Errorf("attempt %d, want 1 (snoozes are not attempts)", j.Attempt)
		}
		if runs.Add(1) < 5 {
			return core.Snooze(0)
		}
		return nil
	}))
	startClient(t, pool, &core.Config{Workers: ws})
	res, err := core.Enqueue(ctx, pool, snoozeArgs{}, &core.EnqueueOpts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	j := waitState(t, pool, res.ID, core.StateSucceeded)
	if runs.Load() != 5 || j.Attempt != 1 || len(j.History) != 0 {
		t.Fatalf("runs=%d job=%+v", runs.Load(), j)
	}
}

// A long snooze ends early when the job is woken, even by a wake that
// arrives while the attempt is still running.
func TestWakeEndsSnooze(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	var runs atomic.Int32
	woken := make(chan struct{})
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[snoozeArgs](func(ctx context.Context, j *core.Job[snoozeArgs]) error {
		switch runs.Add(1) {
		case 1:
			return core.Snooze(time.Hour)
		case 2:
			// Woken while running, before it snoozes: the wake must win.
			if err := core.Wake(ctx, pool, j.ID); err != nil {
				t.Error(err)
			}
			return core.Snooze(time.Hour)
		default:
			close(woken)
			return nil
		}
	}))
	startClient(t, pool, &core.Config{Workers: ws})
	res, _ := core.Enqueue(ctx, pool, snoozeArgs{}, nil)
	waitFor(t, "first snooze", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_jobs WHERE id = $1 AND state = 'queued' AND run_at > now() + interval '30 minutes'`, res.ID) == 1
	})
	if err := core.Wake(ctx, pool, res.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woken:
	case <-time.After(30 * time.Second):
		t.Fatalf("not woken; runs=%d", runs.Load())
	}
	waitState(t, pool, res.ID, core.StateSucceeded)
}

// The lease fence (internal/fence, which the workflow layer fences its
// checkpoints with) passes for the attempt that holds the job and refuses any other
// token; a late attempt's snooze changes nothing.
func TestHoldLeaseFences(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws, started, release, _ := blocking(false)
	c := startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: time.Minute})
	res, _ := core.Enqueue(ctx, pool, blockArgs{}, nil)
	j := <-started
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := fence.Hold(ctx, dbx.PGX{Q: tx}, j.ID, j.LeaseToken); err != nil {
		t.Fatalf("holder refused: %v", err)
	}
	tx.Rollback(ctx)
	// The lease moves on (a rescue, simulated): the old attempt is fenced.
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET lease_token = $2 WHERE id = $1`, res.ID, uuid.New()); err != nil {
		t.Fatal(err)
	}
	if err := fence.Hold(ctx, dbx.PGX{Q: pool}, j.ID, j.LeaseToken); err == nil {
		t.Fatal("stale attempt held the lease")
	}
	release <- core.Snooze(0)
	waitFor(t, "refused snooze counted", func() bool { return c.Stats().LeaseLost == 1 })
	if s := jobState(t, pool, res.ID); s != core.StateClaimed {
		t.Fatalf("late snooze changed the job to %s", s)
	}
}

// The fence's check in a batch: the batch commits while the attempt holds the
// lease, and none of it commits once the lease moved on.
func TestLeaseCheckInBatch(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws, started, release, _ := blocking(false)
	startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: time.Minute})
	res, _ := core.Enqueue(ctx, pool, blockArgs{}, nil)
	j := <-started
	defer func() { release <- nil }()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (n int)`); err != nil {
		t.Fatal(err)
	}
	send := func(n int) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO effects VALUES ($1)`, n)
		sql, args := fence.Check(j.ID, j.LeaseToken)
		b.Queue(sql, args...)
		return pool.SendBatch(ctx, b).Close()
	}
	if err := send(1); err != nil {
		t.Fatalf("holder's batch: %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET lease_token = $2 WHERE id = $1`, res.ID, uuid.New()); err != nil {
		t.Fatal(err)
	}
	if err := send(2); !fence.IsLost(err) {
		t.Fatalf("stale batch: %v, want a lost lease", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("%d effects, want 1 (the stale batch rolled back)", n)
	}
}
