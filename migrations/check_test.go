package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/testdb"
)

// Check names the pending migrations and the command that applies them on
// an empty database, and is nil once it is migrated.
func TestCheckNamesPendingMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	all, err := migrations.Pending(ctx, pool)
	if err != nil || len(all) == 0 {
		t.Fatalf("pending on an empty database: %v, %v", all, err)
	}
	err = migrations.Check(ctx, pool)
	var nm *migrations.NotMigratedError
	if !errors.Is(err, migrations.ErrNotMigrated) || !errors.As(err, &nm) || len(nm.Pending) != len(all) {
		t.Fatalf("Check on an empty database = %v, want a NotMigratedError of %d migrations", err, len(all))
	}
	want := fmt.Sprintf("database not migrated: %d migrations pending — run `relay migrate`", len(all))
	if err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
	if _, err := migrations.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Check(ctx, pool); err != nil {
		t.Errorf("Check after Migrate = %v, want nil", err)
	}
}

// An unreachable database is an error of its own, not "not migrated".
func TestCheckUnreachable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	err = migrations.Check(ctx, pool)
	if err == nil || errors.Is(err, migrations.ErrNotMigrated) || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("Check on a closed port = %v, want a connection error naming the address", err)
	}
}
