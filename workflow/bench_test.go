package workflow_test

import (
	"context"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// measure skips a measurement unless RELAY_WORKFLOW_MEASURE is set: they
// take time and connections, and assert nothing about timing.
func measure(t *testing.T) {
	if os.Getenv("RELAY_WORKFLOW_MEASURE") == "" {
		t.Skip("a measurement: set RELAY_WORKFLOW_MEASURE=1")
	}
}

// TestThreeStepLatency is one caller starting a three-step no-op run and
// waiting for its result, 200 times; it logs p50/p99 (a measurement, not an
// assertion):
//
//	RELAY_WORKFLOW_MEASURE=1 go test -run 'TestThreeStepLatency|TestQueuedThroughput' -v ./workflow/
func TestThreeStepLatency(t *testing.T) {
	measure(t)
	b := setup(t)
	noop := func(ctx context.Context) (int, error) { return 1, nil }
	wf := workflow.MustRegister(b.reg, "chain", func(wctx workflow.Context, _ int) (int, error) {
		for _, k := range []string{"a", "b", "c"} {
			if _, err := workflow.Step(wctx, k, noop, nil); err != nil {
				return 0, err
			}
		}
		return 3, nil
	})
	b.startWith(&core.Config{PollInterval: time.Second})
	ctx := context.Background()
	const n = 200
	var lat []time.Duration
	for i := 0; i < n; i++ {
		began := time.Now()
		h, err := workflow.Start(ctx, b.pool, wf, i, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.Result(ctx, b.pool); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(began))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("three-step run, one caller, %d runs: p50 %s p99 %s", n, lat[n/2], lat[n*99/100])
	var pickup, exec, total float64
	b.pool.QueryRow(ctx, `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM j.attempted_at - r.created_at)) * 1000,
		percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM r.finished_at - j.attempted_at)) * 1000,
		percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM r.finished_at - r.created_at)) * 1000
		FROM relay_workflow_runs r JOIN relay_jobs j ON j.id = r.job_id`).Scan(&pickup, &exec, &total)
	t.Logf("database clock, p50 ms: created→claimed %.2f, claimed→finished %.2f, created→finished %.2f", pickup, exec, total)
}

// TestQueuedThroughput starts 2,000 three-step runs up front and drains
// them; it logs runs/s (a measurement, not an assertion).
func TestQueuedThroughput(t *testing.T) {
	measure(t)
	pool, err := pgxpool.New(context.Background(), testdb.URL(t)+"&pool_max_conns=40")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := &bundle{t: t, pool: pool, reg: workflow.NewRegistry(pool, nil)}
	noop := func(ctx context.Context) (int, error) { return 1, nil }
	wf := workflow.MustRegister(b.reg, "chain", func(wctx workflow.Context, _ int) (int, error) {
		for _, k := range []string{"a", "b", "c"} {
			if _, err := workflow.Step(wctx, k, noop, nil); err != nil {
				return 0, err
			}
		}
		return 3, nil
	})
	ctx := context.Background()
	const n = 2000
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if _, err := workflow.Start(ctx, tx, wf, i, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	b.startWith(&core.Config{Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 30}}})
	b.waitFor("all runs", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs WHERE state = 'completed'`) == n
	})
	el := time.Since(began)
	t.Logf("%d three-step runs drained in %s: %.0f runs/s, %.0f steps/s", n, el, n/el.Seconds(), 3*n/el.Seconds())
}
