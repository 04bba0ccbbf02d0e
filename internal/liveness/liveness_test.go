package liveness_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/internal/liveness"
	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

var quiet = slog.New(slog.DiscardHandler)

func keep(t *testing.T, run func(ctx context.Context)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// A process whose entry expired (paused past its timeout) is not renewed
// as if nothing happened: its next heartbeat records it again, keeping its
// first start.
func TestExpiredEntryRegistersAgain(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	p, err := liveness.New(pool, liveness.Entry{Role: liveness.RoleWorker, Name: "w", Queues: map[string]int{"q": 3}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Register(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var started time.Time
	if err := pool.QueryRow(ctx, `UPDATE relay_processes SET heartbeat_at = now() - interval '1 hour', started_at = now() - interval '2 hours'
		WHERE id = $1 RETURNING started_at`, p.ID()).Scan(&started); err != nil {
		t.Fatal(err)
	}
	keep(t, func(ctx context.Context) { p.Keep(ctx, quiet) })
	testdb.WaitFor(t, "the expired entry to be live again", func() bool {
		return testdb.Count(t, pool, `SELECT count(*) FROM relay_processes WHERE id = $1 AND relay_process_live(heartbeat_at, liveness_secs)`, p.ID()) == 1
	})
	var again time.Time
	if err := pool.QueryRow(ctx, `SELECT started_at FROM relay_processes WHERE id = $1`, p.ID()).Scan(&again); err != nil {
		t.Fatal(err)
	}
	if !again.Equal(started) {
		t.Errorf("started_at %s after registering again; want the first start %s", again, started)
	}
}

// A live process's heartbeats delete the expired entries of any role, and
// judge each by its own timeout: an entry whose last heartbeat is older
// than the sweeper's timeout but within its own stays.
func TestHeartbeatsSweepExpiredEntries(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO relay_processes (id, role, heartbeat_at, liveness_secs)
		SELECT 'dead-' || i, (ARRAY['worker', 'scheduler', 'dispatcher'])[1 + i % 3], now() - interval '10 minutes', 60
		FROM generate_series(1, 250) AS i;
		INSERT INTO relay_processes (id, role, heartbeat_at, liveness_secs)
		VALUES ('slow', 'scheduler', now() - interval '30 seconds', 3600)`); err != nil {
		t.Fatal(err)
	}
	p, err := liveness.New(pool, liveness.Entry{Role: liveness.RoleClient, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Register(ctx, pool); err != nil {
		t.Fatal(err)
	}
	keep(t, func(ctx context.Context) { p.Keep(ctx, quiet) })
	testdb.WaitFor(t, "the 250 expired entries to be swept", func() bool {
		return testdb.Count(t, pool, `SELECT count(*) FROM relay_processes WHERE id LIKE 'dead-%'`) == 0
	})
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_processes WHERE id IN ('slow', $1)`, p.ID()); n != 2 {
		t.Errorf("%d of the slow live entry and the sweeper's own left; want both", n)
	}
	list, err := liveness.List(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Errorf("List: %d live entries; want 2", len(list))
	}
}

// A declaring process found expired at a heartbeat declares again (its
// upsert runs again, its entry is live), instead of renewing an entry the
// other processes may already have retired the declarations of.
func TestExpiredDeclaringProcessDeclaresAgain(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	p, err := liveness.New(pool, liveness.Entry{Role: liveness.RoleScheduler, Namespace: "ns", Declares: []string{"a", "b"}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var upserts, retires atomic.Int32
	d := liveness.Declarations{
		Upsert: func(context.Context, pgx.Tx) error { upserts.Add(1); return nil },
		Retire: func(context.Context, pgx.Tx) error { retires.Add(1); return nil },
	}
	if err := p.Declare(ctx, d); err != nil {
		t.Fatal(err)
	}
	if testdb.Count(t, pool, `SELECT count(*) FROM relay_processes WHERE id = $1 AND namespace = 'ns' AND declares = '{a,b}'`, p.ID()) != 1 {
		t.Fatal("Declare did not record the entry with its namespace and names")
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_processes SET heartbeat_at = now() - interval '1 hour' WHERE id = $1`, p.ID()); err != nil {
		t.Fatal(err)
	}
	keep(t, func(ctx context.Context) { p.KeepDeclared(ctx, d, quiet, "test") })
	testdb.WaitFor(t, "the declaration again", func() bool { return upserts.Load() >= 2 })
	testdb.WaitFor(t, "the entry to be live", func() bool {
		return testdb.Count(t, pool, `SELECT count(*) FROM relay_processes WHERE id = $1 AND relay_process_live(heartbeat_at, liveness_secs)`, p.ID()) == 1
	})
	if retires.Load() < 2 {
		t.Errorf("%d retirements; want one per declaration", retires.Load())
	}
}
