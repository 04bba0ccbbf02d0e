package core_test

import (
	"context"
	"testing"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

// A wake whose transaction is still open holds the woken job even when it
// is already due: a claim made meanwhile steps over it (FOR UPDATE SKIP
// LOCKED, as the claim), so no execution can start before the waker's
// writes are visible. Before, a due job was not touched, and a claim in
// that window ran it without them: `relay prove workflow` found a parent
// run, woken by one child while due after the other's wake, that read its
// history before the second child's outcome committed and suspended for an
// hour.
func TestWakeHoldsADueJobUntilCommit(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	res, err := core.Enqueue(ctx, pool, snoozeArgs{}, nil) // queued and due
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := core.Wake(ctx, tx, res.ID); err != nil {
		t.Fatal(err)
	}
	const claimable = `SELECT count(*) FROM (SELECT id FROM relay_jobs WHERE id = $1 AND state = 'queued' AND run_at <= now() FOR UPDATE SKIP LOCKED) x`
	if n := count(t, pool, claimable, res.ID); n != 0 {
		t.Fatal("a claim could take the job while its waker's transaction was open")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, claimable, res.ID); n != 1 {
		t.Fatal("the job is not claimable after the wake committed")
	}
}
