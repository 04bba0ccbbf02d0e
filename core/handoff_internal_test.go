package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/testkit/testdb"
)

// finishHead is one way a caller's transaction ends a key's running head.
type finishHead struct {
	name string
	do   func(ctx context.Context, tx pgx.Tx, head *JobRow) error
}

var finishHeads = []finishHead{
	{"complete", func(ctx context.Context, tx pgx.Tx, head *JobRow) error {
		ids, tokens := idsAndTokens([]*JobRow{head})
		_, err := tx.Exec(ctx, sqlCompleteMany, ids, tokens)
		return err
	}},
	{"cancel", func(ctx context.Context, tx pgx.Tx, head *JobRow) error { return Cancel(ctx, tx, head.ID) }},
	{"delete", func(ctx context.Context, tx pgx.Tx, head *JobRow) error {
		_, err := tx.Exec(ctx, `DELETE FROM relay_jobs WHERE id = $1`, head.ID)
		return err
	}},
}

// keyWaiting says whether job id waits behind its key's head.
func keyWaiting(t *testing.T, pool *pgxpool.Pool, id int64) bool {
	t.Helper()
	var waiting bool
	if err := pool.QueryRow(context.Background(), `SELECT key_waiting FROM relay_jobs WHERE id = $1`, id).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	return waiting
}

// finishHeadAfterSnapshot reproduces the interleaving of the review's
// blocker: a transaction at iso takes its snapshot, a job of the key is
// enqueued and committed on another connection, then the transaction ends
// the key's head and commits. It returns the job enqueued, and the
// commit's error (a serialization failure is allowed under SERIALIZABLE,
// which PostgreSQL may detect; not under REPEATABLE READ, where no row
// read changed).
func finishHeadAfterSnapshot(t *testing.T, pool *pgxpool.Pool, iso pgx.TxIsoLevel, finish finishHead) (next int64, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	enqueueKeyed(t, pool, "k")
	head := claimSQL(t, pool, 10)
	if len(head) != 1 {
		t.Fatalf("claimed %v, want the key's head", claimedIDs(head))
	}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	// The first statement takes the snapshot; it reads nothing of the key.
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	next = enqueueKeyed(t, pool, "k") // committed after the snapshot
	if !keyWaiting(t, pool, next) {
		t.Fatalf("job %d enqueued behind a running head does not wait", next)
	}
	err = finish.do(ctx, tx, head[0])
	if err == nil {
		err = tx.Commit(ctx)
	}
	var pgErr *pgconn.PgError
	if err != nil && !(iso == pgx.Serializable && errors.As(err, &pgErr) && pgErr.Code == "40001") {
		t.Fatalf("%s the head at %s: %v", finish.name, iso, err)
	}
	return next, err
}

// waitClaim polls, with a deadline, until a claim of the default queue
// takes exactly job want, running between polls (when it is not nil).
func waitClaim(t *testing.T, pool *pgxpool.Pool, want int64, between func()) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("job %d to be claimable", want), func() bool {
		if between != nil {
			between()
		}
		got := claimSQL(t, pool, 10)
		switch {
		case len(got) == 0:
			return false
		case len(got) != 1 || got[0].ID != want:
			t.Fatalf("claimed %v, want [%d]", claimedIDs(got), want)
		}
		return true
	})
}

// A key's head finished (completed, cancelled or deleted) in a REPEATABLE
// READ or SERIALIZABLE transaction whose snapshot predates a job of the
// key enqueued and committed meanwhile: the commit-time fix cannot see that
// job, and hands the key off; the re-fix (here the rescuer's run, with no
// client listening) makes it claimable. Without the hand-off the job waits
// for ever.
func TestKeyHeadFinishedInOlderSnapshotIsRefixed(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		for _, finish := range finishHeads {
			t.Run(fmt.Sprintf("%s/%s", finish.name, iso), func(t *testing.T) {
				t.Parallel()
				pool := testdb.New(t)
				next, err := finishHeadAfterSnapshot(t, pool, iso, finish)
				if err != nil {
					// SERIALIZABLE refused the commit: the head still runs,
					// and its successor rightly waits.
					t.Logf("the commit failed: %v", err)
					headsOK(t, pool)
					return
				}
				if !keyWaiting(t, pool, next) {
					t.Logf("job %d was promoted at commit", next)
				}
				c := &Client{pool: pool, logger: slog.Default()}
				waitClaim(t, pool, next, func() { c.takeKeyHandOffs(context.Background()) })
				headsOK(t, pool)
				var left int
				if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM relay_job_key_refix`).Scan(&left); err != nil {
					t.Fatal(err)
				}
				if left != 0 {
					t.Fatalf("%d hand-offs left after the re-fix", left)
				}
			})
		}
	}
}

// The same interleaving with a client running (on another queue, its
// rescuer off): its listener hears the hand-off and re-fixes the key at
// once, with no poll or rescuer involved.
func TestKeyHeadFinishedInOlderSnapshotIsRefixedOnNotify(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ws := NewWorkers()
	if err := AddWorker(ws, WorkFunc[floorArgs](func(context.Context, *Job[floorArgs]) error { return nil })); err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(pool, &Config{
		Workers:        ws,
		Queues:         map[string]QueueConfig{"elsewhere": {}},
		RescueInterval: -1,
		Retention:      Retention{Interval: -1},
		NoClaimFloor:   true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Stop(ctx) //nolint:errcheck
	})
	waitUntil(t, "the client's listener", func() bool {
		var n int
		pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'relay-listener %' AND query LIKE 'LISTEN "relay_control"%'`).Scan(&n) //nolint:errcheck
		return n > 0
	})
	next, err := finishHeadAfterSnapshot(t, pool, pgx.RepeatableRead, finishHeads[0])
	if err != nil {
		t.Fatal(err)
	}
	waitClaim(t, pool, next, nil)
	headsOK(t, pool)
}

// A key's head finishes while another transaction holds the row of the
// key's next job (core.Wake in a caller's transaction, a user's SELECT ...
// FOR UPDATE): the finisher's commit-time fix steps over the row instead of
// waiting for that transaction, and hands the key off; once the holder ends
// (committing a change that fires no key trigger, or rolling back), the
// re-fix makes the next job claimable.
func TestKeyHeadFinishDoesNotWaitOnNextRowLock(t *testing.T) {
	t.Parallel()
	holders := []struct {
		name string
		hold func(ctx context.Context, tx pgx.Tx, id int64) error
		end  func(ctx context.Context, tx pgx.Tx) error
	}{
		{"wake-commit", func(ctx context.Context, tx pgx.Tx, id int64) error { return Wake(ctx, tx, id) },
			func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) }},
		{"for-update-rollback", func(ctx context.Context, tx pgx.Tx, id int64) error {
			_, err := tx.Exec(ctx, `SELECT 1 FROM relay_jobs WHERE id = $1 FOR UPDATE`, id)
			return err
		}, func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) }},
	}
	for _, h := range holders {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			pool := testdb.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			enqueueKeyed(t, pool, "k")
			next := enqueueKeyed(t, pool, "k")
			head := claimSQL(t, pool, 10)
			if len(head) != 1 {
				t.Fatalf("claimed %v, want the key's head", claimedIDs(head))
			}
			holder, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback(ctx) //nolint:errcheck
			if err := h.hold(ctx, holder, next); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				ids, tokens := idsAndTokens(head)
				_, err := pool.Exec(ctx, sqlCompleteMany, ids, tokens)
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("completing the head: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("completing the head waited for the transaction holding its successor's row")
			}
			c := &Client{pool: pool, logger: slog.Default()}
			c.takeKeyHandOffs(ctx) // the row is still held: handed off again
			if got := claimSQL(t, pool, 10); len(got) != 0 {
				t.Fatalf("claimed %v while the successor's row is held", claimedIDs(got))
			}
			if err := h.end(ctx, holder); err != nil {
				t.Fatal(err)
			}
			waitClaim(t, pool, next, func() { c.takeKeyHandOffs(ctx) })
			headsOK(t, pool)
		})
	}
}
