package workflow_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

func TestThreeStepLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
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
