package migrations_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/devpg"
	"github.com/relayq/relay/testkit/testdb"
)

// Through a transaction-pooling PgBouncer the migrations refuse to run
// (their session advisory lock would stay on whichever server connection
// took it), in any pgx mode, with ErrTxPooled; through session pooling
// they run.
func TestMigrateRefusesTransactionPooling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tx := testdb.PgBouncer(t, devpg.BouncerOptions{})
	for _, mode := range []string{"", "&default_query_exec_mode=exec", "&default_query_exec_mode=simple_protocol"} {
		pool, err := pgxpool.New(ctx, testdb.Through(tx, testdb.EmptyURL(t))+mode)
		if err != nil {
			t.Fatal(err)
		}
		_, err = migrations.Migrate(ctx, pool)
		pool.Close()
		if !errors.Is(err, migrations.ErrTxPooled) {
			t.Errorf("mode %q: Migrate through transaction pooling: %v, want ErrTxPooled", mode, err)
		}
	}
	session := testdb.PgBouncer(t, devpg.BouncerOptions{PoolMode: "session"})
	pool, err := pgxpool.New(ctx, testdb.Through(session, testdb.EmptyURL(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if res, err := migrations.Migrate(ctx, pool); err != nil || len(res.Applied) == 0 {
		t.Fatalf("Migrate through session pooling: %d applied, %v", len(res.Applied), err)
	}
}

// With the URL's search_path naming another schema, the migrations create
// every relay table (their own bookkeeping included) there, and public
// stays empty.
func TestMigrateIntoSchemaOfSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE SCHEMA relay`); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url+"&search_path=relay")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := migrations.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var inRelay, inPublic int
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE table_schema = 'relay'), count(*) FILTER (WHERE table_schema = 'public')
		FROM information_schema.tables WHERE table_name LIKE 'relay%'`).Scan(&inRelay, &inPublic); err != nil {
		t.Fatal(err)
	}
	if inRelay < 10 || inPublic != 0 {
		t.Errorf("relay tables: %d in schema relay, %d in public; want all in relay", inRelay, inPublic)
	}
	if res, err := migrations.Migrate(ctx, pool); err != nil || len(res.Applied) != 0 {
		t.Errorf("second Migrate in the schema: %d applied, %v; want none", len(res.Applied), err)
	}
}
