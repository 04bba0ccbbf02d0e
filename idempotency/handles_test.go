package idempotency_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/idempotency"
)

// Once joins a bun or a database/sql transaction as it joins a pgx.Tx:
// fn's write and the key commit together (a second call replays without
// running fn) or roll back together (the next call runs fn). A handle
// that is not a transaction fails with ErrNotTransaction and runs nothing.
func TestOnceJoinsBunAndSQLTransactions(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	sqldb := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { sqldb.Close() })
	bundb := bun.NewDB(sqldb, pgdialect.New())
	type txCase struct {
		name  string
		begin func() (tx core.DB, exec func(q string, args ...any) error, commit, rollback func() error)
	}
	for _, c := range []txCase{
		{"bun.Tx", func() (core.DB, func(string, ...any) error, func() error, func() error) {
			tx, err := bundb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			exec := func(q string, args ...any) error { _, err := tx.Tx.ExecContext(ctx, q, args...); return err }
			return tx, exec, tx.Commit, tx.Rollback
		}},
		{"*sql.Tx", func() (core.DB, func(string, ...any) error, func() error, func() error) {
			tx, err := sqldb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			exec := func(q string, args ...any) error { _, err := tx.ExecContext(ctx, q, args...); return err }
			return tx, exec, tx.Commit, tx.Rollback
		}},
	} {
		order := "handles-" + c.name
		ran := 0
		call := func(commit bool) (int, bool) {
			t.Helper()
			tx, exec, doCommit, doRollback := c.begin()
			res, replayed, err := idempotency.Once(ctx, tx, "ledger", order, func(ctx context.Context) (int, error) {
				ran++
				return 42, exec(`INSERT INTO ledger VALUES ($1, 42)`, order)
			}, nil)
			if err != nil {
				doRollback() //nolint:errcheck
				t.Fatalf("%s: Once: %v", c.name, err)
			}
			end := doRollback
			if commit {
				end = doCommit
			}
			if err := end(); err != nil {
				t.Fatal(err)
			}
			return res, replayed
		}
		if res, replayed := call(false); res != 42 || replayed || ran != 1 {
			t.Fatalf("%s: first call %d %v, ran %d", c.name, res, replayed, ran)
		}
		if n := count(t, pool, `SELECT count(*) FROM ledger WHERE order_id = $1`, order); n != 0 {
			t.Fatalf("%s: a rolled-back Once left %d ledger rows", c.name, n)
		}
		if res, replayed := call(true); res != 42 || replayed || ran != 2 {
			t.Fatalf("%s: after a rollback %d %v, ran %d: want fn run again", c.name, res, replayed, ran)
		}
		if res, replayed := call(true); res != 42 || !replayed || ran != 2 {
			t.Fatalf("%s: after a commit %d %v, ran %d: want a replay", c.name, res, replayed, ran)
		}
		if n := count(t, pool, `SELECT count(*) FROM ledger WHERE order_id = $1`, order); n != 1 {
			t.Fatalf("%s: %d ledger rows, want 1", c.name, n)
		}
	}
	for _, bad := range []core.DB{pool, sqldb, bundb, "postgres://wrong", nil} {
		ran := false
		_, _, err := idempotency.Once(ctx, bad, "ledger", "never", func(context.Context) (int, error) { ran = true; return 0, nil }, nil)
		if !errors.Is(err, idempotency.ErrNotTransaction) || ran {
			t.Errorf("Once on %T: %v (fn ran: %v), want ErrNotTransaction", bad, err, ran)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_idempotency_keys WHERE key = 'never'`); n != 0 {
		t.Errorf("wrong handles stored %d keys", n)
	}
}
