package workflow_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/testkit/devpg"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// The eager statement's lock_timeout is its own transaction's: on a pool
// of one connection, and through a transaction-pooling PgBouncer of one
// server connection, the next statement sees the server's default, after
// a start, duplicates, and a 55P03 fallback alike.
func TestEagerLockTimeoutStaysInTheStatement(t *testing.T) {
	t.Parallel()
	bouncer := testdb.PgBouncer(t, devpg.BouncerOptions{PoolSize: 1})
	for _, via := range []string{"direct", "exec", "simple_protocol"} {
		t.Run(via, func(t *testing.T) {
			direct := testdb.URL(t)
			u := direct + "&pool_max_conns=1"
			if via != "direct" {
				u = testdb.Through(bouncer, direct) + "&pool_max_conns=1&default_query_exec_mode=" + via
			}
			pool, c, wf := eagerOnOnePool(t, u, direct, "eager.lt")
			ctx := callerCtx(t)
			var before string
			if err := pool.QueryRow(ctx, `SHOW lock_timeout`).Scan(&before); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				if out, err := workflow.RunNow(ctx, c, wf, i, &workflow.StartOpts{ID: "lt"}); err != nil || out != 0 {
					t.Fatalf("RunNow %d: %d, %v", i, out, err)
				}
				var lt string
				if err := pool.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lt); err != nil {
					t.Fatal(err)
				}
				if lt != before {
					t.Fatalf("after RunNow %d: lock_timeout %q on the pool, was %q", i, lt, before)
				}
			}
			// A 55P03: the id held by an open start on another pool.
			side := openSide(t, direct)
			tx, err := side.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			if _, err := workflow.Start(ctx, tx, wf, 7, &workflow.StartOpts{ID: "lt-held"}); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { _, err := workflow.RunNow(ctx, c, wf, 8, &workflow.StartOpts{ID: "lt-held"}); done <- err }()
			waitForQueuedStartBlocked(t, ctx, side, done)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			var lt string
			if err := pool.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lt); err != nil {
				t.Fatal(err)
			}
			if lt != before {
				t.Fatalf("after a 55P03 fallback: lock_timeout %q on the pool, was %q", lt, before)
			}
		})
	}
}

func openSide(t *testing.T, u string) *pgxpool.Pool {
	p, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
