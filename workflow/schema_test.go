package workflow_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// On a database never migrated, Start (on the pool or in a caller's
// transaction) and StartNamed fail with the number of pending migrations
// and the command that applies them, not the server's raw 42P01.
func TestStartOnAnUnmigratedDatabaseSaysWhatToDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reg := workflow.NewRegistry(pool, nil)
	defer reg.Close()
	wf := workflow.MustRegister(reg, "noop", func(wctx workflow.Context, in int) (int, error) { return in, nil })
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, migrations.ErrNotMigrated) {
			t.Fatalf("%s on an unmigrated database = %v, want ErrNotMigrated", what, err)
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "workflow: start noop: database not migrated: ") || !strings.Contains(msg, "pending — run `relay migrate`") {
			t.Errorf("%s: message %q does not say what to do", what, msg)
		}
	}
	_, err = workflow.Start(ctx, pool, wf, 1, nil)
	check("Start on the pool", err)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = workflow.Start(ctx, tx, wf, 1, nil)
	tx.Rollback(ctx) //nolint:errcheck
	check("Start in a transaction", err)
	_, _, err = workflow.StartNamed(ctx, pool, reg, "noop", nil, nil)
	check("StartNamed", err)
}
