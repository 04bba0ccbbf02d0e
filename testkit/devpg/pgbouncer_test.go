package devpg

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
)

// StartBouncer runs PgBouncer in transaction pooling in front of a cluster:
// two transactions of one client connection can land on different server
// connections, and Stop removes its directory.
func TestStartBouncerPoolsTransactions(t *testing.T) {
	if _, err := BinDir(); err != nil {
		t.Skip(err)
	}
	if _, err := BouncerBin(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ctx := context.Background()
	c, err := Start(ctx, Options{Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop() //nolint:errcheck
	b, err := StartBouncer(ctx, c.URL, BouncerOptions{PoolSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	one, err := pgx.Connect(ctx, b.URL+"&default_query_exec_mode=simple_protocol")
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close(ctx)
	two, err := pgx.Connect(ctx, b.URL+"&default_query_exec_mode=simple_protocol")
	if err != nil {
		t.Fatal(err)
	}
	defer two.Close(ctx)
	var first, shared int
	if err := one.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&first); err != nil {
		t.Fatal(err)
	}
	// one is idle between transactions: its server connection went back to
	// the pool, and the next client's transaction takes it.
	if err := two.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&shared); err != nil {
		t.Fatal(err)
	}
	if first != shared {
		t.Errorf("two clients got server connections %d and %d: not transaction pooling", first, shared)
	}
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.Dir); !os.IsNotExist(err) {
		t.Errorf("the bouncer's directory is still there (stat: %v)", err)
	}
}
