package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/testdb"
)

// The scheduler's and the outbox's process tables become relay_processes:
// each entry moves with its role, namespace, declarations, times and
// liveness timeout (a live scheduler stays live through the migration),
// and the old tables are gone.
func TestProcessesMigrationMovesEntries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sqldb := stdlib.OpenDBFromPool(pool)
	defer sqldb.Close()
	if _, err := migrations.MigrateFS(ctx, sqldb, filesBefore(t, "20261203010001_processes.tx.up.sql")); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO relay_scheduler_processes (id, namespace, schedules, heartbeat_at, liveness_secs)
		VALUES ('s1', 'billing', '{invoice,report}', now(), 30);
		INSERT INTO relay_outbox_processes (id, namespace, subscriptions, heartbeat_at, liveness_secs)
		VALUES ('o1', 'mail', '{"[\"t\",\"k\",\"\"]"}', now() - interval '1 hour', 60)`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.MigrateDB(ctx, sqldb); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `
		SELECT id, role, namespace, array_to_string(declares, '|'), liveness_secs, relay_process_live(heartbeat_at, liveness_secs)
		FROM relay_processes ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		id, role, ns, declares string
		secs                   float64
		live                   bool
	}
	var got []entry
	for rows.Next() {
		var e entry
		if err := rows.Scan(&e.id, &e.role, &e.ns, &e.declares, &e.secs, &e.live); err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []entry{
		{"o1", "dispatcher", "mail", `["t","k",""]`, 60, false},
		{"s1", "scheduler", "billing", "invoice|report", 30, true},
	}
	if len(got) != len(want) {
		t.Fatalf("entries %+v; want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: %+v; want %+v", i, got[i], want[i])
		}
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname IN ('relay_scheduler_processes', 'relay_outbox_processes')`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d old process tables left", left)
	}
}
