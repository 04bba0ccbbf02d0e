package scheduler_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/scheduler"
	"github.com/relayq/relay/testkit/testdb"
)

// TriggerNow, Pause, Resume and List take any core.DB: in a bun or a
// database/sql transaction, the triggered fire and its job commit with
// the caller's transaction and vanish with its rollback; a handle of
// another type fails with core.ErrUnsupportedDB and writes nothing.
func TestAdminJoinsBunAndSQLTransactions(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	sqldb := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { sqldb.Close() })
	bundb := bun.NewDB(sqldb, pgdialect.New())
	s, err := scheduler.New(pool, &scheduler.Config{Schedules: []scheduler.Schedule{{Name: "handles", Spec: "@every 1h", Args: reportArgs{Region: "eu"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	type txCase struct {
		name  string
		begin func() (tx core.DB, commit, rollback func() error)
	}
	for _, c := range []txCase{
		{"bun.Tx", func() (core.DB, func() error, func() error) {
			tx, err := bundb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			return tx, tx.Commit, tx.Rollback
		}},
		{"*sql.Tx", func() (core.DB, func() error, func() error) {
			tx, err := sqldb.BeginTx(ctx, &sql.TxOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return tx, tx.Commit, tx.Rollback
		}},
	} {
		for _, commit := range []bool{false, true} {
			tx, doCommit, doRollback := c.begin()
			res, err := scheduler.TriggerNow(ctx, tx, "handles")
			if err != nil {
				t.Fatalf("%s: TriggerNow: %v", c.name, err)
			}
			if err := scheduler.Pause(ctx, tx, "handles"); err != nil {
				t.Fatalf("%s: Pause: %v", c.name, err)
			}
			list, err := scheduler.List(ctx, tx)
			if err != nil || len(list) != 1 || !list[0].Paused {
				t.Fatalf("%s: List in the transaction: %+v, %v", c.name, list, err)
			}
			if err := scheduler.Resume(ctx, tx, "handles"); err != nil {
				t.Fatalf("%s: Resume: %v", c.name, err)
			}
			end, want := doRollback, 0
			if commit {
				end, want = doCommit, 1
			}
			if err := end(); err != nil {
				t.Fatal(err)
			}
			if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE id = $1`, res.ID); n != want {
				t.Errorf("%s, commit %v: %d jobs of the trigger, want %d", c.name, commit, n, want)
			}
			if n := count(t, pool, `SELECT count(*) FROM relay_schedule_fires WHERE outcome = 'triggered' AND job_id = $1`, res.ID); n != want {
				t.Errorf("%s, commit %v: %d fire records of the trigger, want %d", c.name, commit, n, want)
			}
		}
	}
	// On a database/sql pool, TriggerNow is its own transaction.
	res, err := scheduler.TriggerNow(ctx, sqldb, "handles")
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE id = $1`, res.ID); n != 1 {
		t.Errorf("a trigger on *sql.DB left %d jobs", n)
	}

	jobs := count(t, pool, `SELECT count(*) FROM relay_jobs`)
	for _, bad := range []core.DB{"postgres://wrong", 42, (*sql.DB)(nil), nil} {
		if _, err := scheduler.TriggerNow(ctx, bad, "handles"); !errors.Is(err, core.ErrUnsupportedDB) {
			t.Errorf("TriggerNow on %T: %v, want ErrUnsupportedDB", bad, err)
		}
		if err := scheduler.Pause(ctx, bad, "handles"); !errors.Is(err, core.ErrUnsupportedDB) {
			t.Errorf("Pause on %T: %v, want ErrUnsupportedDB", bad, err)
		}
		if _, err := scheduler.List(ctx, bad); !errors.Is(err, core.ErrUnsupportedDB) {
			t.Errorf("List on %T: %v, want ErrUnsupportedDB", bad, err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs`); n != jobs {
		t.Errorf("wrong handles wrote %d jobs", n-jobs)
	}
}
