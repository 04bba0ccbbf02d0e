package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type bulkArgs struct {
	N int `json:"n"`
}

func (bulkArgs) Kind() string { return "bulk" }

// A large batch on pgx goes through COPY: ids come back in order and match
// their jobs, ordering keys are kept, a rolled-back transaction leaves
// nothing, and the workers are woken (polling off) when a pool batch
// commits.
func TestBatchEnqueueByCopy(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	params := func(n int) []core.EnqueueParams {
		ps := make([]core.EnqueueParams, n)
		for i := range ps {
			ps[i] = core.EnqueueParams{Args: bulkArgs{N: i}}
			if i%100 == 0 {
				ps[i].Opts = &core.EnqueueOpts{OrderingKey: "k", Priority: new(3)}
			}
		}
		return ps
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := core.EnqueueMany(ctx, tx, params(300)); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs`); n != 0 {
		t.Fatalf("%d jobs after rollback", n)
	}

	ran := make(chan struct{}, 1000)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[bulkArgs](func(context.Context, *core.Job[bulkArgs]) error { ran <- struct{}{}; return nil }))
	c := startClient(t, pool, &core.Config{Workers: ws, PollInterval: time.Hour})
	_ = c
	waitFor(t, "the listener", func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'`) > 0
	})

	res, err := core.EnqueueMany(ctx, pool, params(500))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(res); i++ {
		if res[i].ID <= res[i-1].ID || res[i].Duplicate {
			t.Fatalf("ids not ascending at %d: %d, %d", i, res[i-1].ID, res[i].ID)
		}
	}
	for _, i := range []int{0, 1, 250, 499} {
		var n, prio int
		var key *string
		if err := pool.QueryRow(ctx, `SELECT (args->>'n')::int, priority, ordering_key FROM relay_jobs WHERE id = $1`, res[i].ID).Scan(&n, &prio, &key); err != nil {
			t.Fatal(err)
		}
		wantKey := i%100 == 0
		if n != i || (key != nil) != wantKey || (wantKey && prio != 3) {
			t.Errorf("job %d: n=%d priority=%d key=%v", i, n, prio, key)
		}
	}
	waitFor(t, "all 500 to run", func() bool { return c.Stats().Succeeded == 500 })
}
