package core_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/testdb"
)

// On a database never migrated, Start fails with the number of pending
// migrations and the command that applies them, and starts nothing.
func TestStartFailsOnAnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error { return nil }))
	c, err := core.NewClient(pool, &core.Config{Workers: ws})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Start(ctx)
	if !errors.Is(err, migrations.ErrNotMigrated) {
		t.Fatalf("Start on an unmigrated database = %v, want ErrNotMigrated", err)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "core: start: database not migrated: ") || !strings.Contains(msg, "migrations pending — run `relay migrate`") {
		t.Errorf("message %q does not say what to do", msg)
	}
	// Nothing was started: the client can start once migrated.
	if _, err := migrations.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start after migrating: %v", err)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
}

// An unreachable database fails Start with one line naming the address.
func TestStartFailsOnAnUnreachableDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := core.NewClient(pool, &core.Config{Workers: core.NewWorkers()})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Start(ctx)
	if err == nil || errors.Is(err, migrations.ErrNotMigrated) || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("Start on a closed port = %v, want a connection error naming the address", err)
	}
}
