package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/testdb"
)

// Migration *_after_triggers_small_when applied under load: a
// transaction that has finished a keyed head (its note taken and its
// deferred key event queued by the old triggers) is open while the
// migration starts; the migration waits for it, and afterwards the keys'
// bookkeeping is what it would have been without the migration, and keyed
// jobs go on through the new triggers.
func TestMigrationMidFlightKeepsKeysConsistent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const stopped = "20261210010001_after_triggers_small_when.tx.up.sql"
	pool, err := pgxpool.New(ctx, testdb.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sqldb := stdlib.OpenDBFromPool(pool)
	defer sqldb.Close()
	if _, err := migrations.MigrateFS(ctx, sqldb, filesBefore(t, stopped)); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	claim := func(id string) {
		exec(`UPDATE relay_jobs SET state = 'claimed', attempt = attempt + 1, attempted_at = now(),
			lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute' WHERE id = ` + id)
	}
	// Keys a (heads 1, 2 waiting), b (head 3 claimed, 4 waiting), c (head 5 dead, 6 waiting).
	exec(`INSERT INTO relay_jobs (id, kind, queue, ordering_key) VALUES
		(1, 'k', 'q', 'a'), (2, 'k', 'q', 'a'), (3, 'k', 'q', 'b'), (4, 'k', 'q', 'b'),
		(5, 'k', 'q', 'c'), (6, 'k', 'q', 'c')`)
	claim("1")
	claim("3")
	claim("5")
	exec(`UPDATE relay_jobs SET state = 'dead', finalized_at = now(), lease_token = NULL, lease_expires_at = NULL WHERE id = 5`)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE relay_jobs SET state = 'succeeded', finalized_at = now(), lease_token = NULL, lease_expires_at = NULL WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	migrated := make(chan error, 1)
	go func() {
		_, err := migrations.MigrateDB(ctx, sqldb)
		migrated <- err
	}()
	testdb.WaitFor(t, "the migration to wait on relay_jobs", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE relation = 'relay_jobs'::regclass AND NOT granted`).Scan(&n)
		return n > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-migrated:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("migration did not finish")
	}
	// Through the new triggers: c's dead head requeued and completed, b's
	// head completed, a's new head claimed and retried.
	exec(`UPDATE relay_jobs SET state = 'queued', finalized_at = NULL, run_at = now() WHERE id = 5`)
	claim("5")
	exec(`UPDATE relay_jobs SET state = 'succeeded', finalized_at = now(), lease_token = NULL, lease_expires_at = NULL WHERE id = 5`)
	exec(`UPDATE relay_jobs SET state = 'succeeded', finalized_at = now(), lease_token = NULL, lease_expires_at = NULL WHERE id = 3`)
	claim("2")
	exec(`UPDATE relay_jobs SET state = 'queued', lease_token = NULL, lease_expires_at = NULL WHERE id = 2`)
	exec(`INSERT INTO relay_jobs (id, kind, queue, ordering_key) VALUES (7, 'k', 'q', 'a')`)
	// Every queued keyed job waits exactly when an earlier job of its key
	// is queued, claimed or dead; nothing is left to re-fix.
	var wrong []int64
	if err := pool.QueryRow(ctx, `
		SELECT coalesce(array_agg(j.id ORDER BY j.id), '{}') FROM relay_jobs AS j
		WHERE j.state = 'queued' AND j.ordering_key IS NOT NULL
		  AND j.key_waiting <> EXISTS (
		      SELECT 1 FROM relay_jobs AS e WHERE e.queue = j.queue AND e.ordering_key = j.ordering_key
		        AND e.id < j.id AND e.state IN ('queued', 'claimed', 'dead'))`).Scan(&wrong); err != nil {
		t.Fatal(err)
	}
	var refix int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_job_key_refix`).Scan(&refix); err != nil {
		t.Fatal(err)
	}
	if len(wrong) > 0 || refix > 0 {
		t.Errorf("jobs %v wait wrongly; %d keys left to re-fix", wrong, refix)
	}
}

// An install hardened as PostgreSQL's docs suggest (the owner's default
// privileges revoke EXECUTE on new functions from PUBLIC, and the
// application role was granted EXECUTE on the functions there were at
// install time) upgrades through *_after_triggers_small_when: every
// update of a job's state now calls relay_jobs_key_moved from the key
// triggers' WHEN clause, and PostgreSQL checks EXECUTE on it when it
// prepares the clause, for keyed and unkeyed rows alike. Before the
// migration the clauses a claim plans named built-ins only. With fix (a
// GRANT of the new function to PUBLIC in the migration) the claim goes on.
