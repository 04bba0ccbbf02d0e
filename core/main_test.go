package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// jobState reads a job's state from the table.
func jobState(t *testing.T, pool *pgxpool.Pool, id int64) core.JobState {
	t.Helper()
	j, err := core.JobGet(context.Background(), pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return j.State
}

func waitState(t *testing.T, pool *pgxpool.Pool, id int64, want core.JobState) *core.JobRow {
	t.Helper()
	var j *core.JobRow
	waitFor(t, "job to be "+string(want), func() bool {
		var err error
		j, err = core.JobGet(context.Background(), pool, id)
		if err != nil {
			t.Fatal(err)
		}
		return j.State == want
	})
	return j
}

// startClient starts a client with workers and stops it when the test ends.
func startClient(t *testing.T, pool *pgxpool.Pool, cfg *core.Config) *core.Client {
	t.Helper()
	c, err := core.NewClient(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Stop(ctx)
	})
	return c
}

func waitFor(t *testing.T, what string, cond func() bool) { t.Helper(); testdb.WaitFor(t, what, cond) }

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	return testdb.Count(t, pool, sql, args...)
}
