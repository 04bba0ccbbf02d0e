package workflow_test

import (
	"context"
	"fmt"
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

// TestUpdateLatency is one caller sending updates to a run that handles
// them one after another, 50 per run, in four rounds that alternate the
// caller's wait: on the registry's listener (Update with the registry) and
// polling (Update without one); first with a handler that answers at once,
// then with one whose step takes 100 ms. It logs, per round, the round
// trip's p50 and p99 and the p50 from the answer's transaction
// (handled_at) to Update's return (a measurement, not an assertion):
//
//	RELAY_WORKFLOW_MEASURE=1 go test -run TestUpdateLatency -v ./workflow/
func TestUpdateLatency(t *testing.T) {
	measure(t)
	b := setup(t)
	type in struct {
		N    int           `json:"n"`
		Work time.Duration `json:"work"`
	}
	wf := workflow.MustRegister(b.reg, "counter", func(wctx workflow.Context, in in) (int, error) {
		total := 0
		for i := 0; i < in.N; i++ {
			if _, err := workflow.HandleUpdate(wctx, "add", func(wctx workflow.Context, d int) (int, error) {
				if in.Work > 0 {
					// In a step, so that replays do not wait again.
					if _, err := workflow.Step(wctx, fmt.Sprintf("work:%d", i), func(ctx context.Context) (bool, error) {
						time.Sleep(in.Work)
						return true, nil
					}, nil); err != nil {
						return 0, err
					}
				}
				total += d
				return total, nil
			}, nil); err != nil {
				return 0, err
			}
		}
		return total, nil
	})
	b.startWith(&core.Config{PollInterval: time.Second})
	ctx := context.Background()
	const n = 50
	for _, work := range []time.Duration{0, 100 * time.Millisecond} {
		for round := range 4 {
			reg, mode := b.reg, "listener"
			if round%2 == 1 {
				reg, mode = nil, "poll"
			}
			h, err := workflow.Start(ctx, b.pool, wf, in{N: n, Work: work}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var lat, wake []time.Duration
			for i := 0; i < n; i++ {
				began := time.Now()
				if _, err := workflow.Update[int](ctx, b.pool, reg, h.ID, "add", 1); err != nil {
					t.Fatal(err)
				}
				back := time.Now()
				lat = append(lat, back.Sub(began))
				var handled time.Time
				if err := b.pool.QueryRow(ctx, `SELECT handled_at FROM relay_workflow_updates WHERE run_id = $1 ORDER BY id DESC LIMIT 1`, h.ID).Scan(&handled); err != nil {
					t.Fatal(err)
				}
				wake = append(wake, back.Sub(handled))
			}
			if _, err := h.Result(ctx, b.pool); err != nil {
				t.Fatal(err)
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			sort.Slice(wake, func(i, j int) bool { return wake[i] < wake[j] })
			r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
			t.Logf("handler step %s, round %d, %s: %d updates: round trip p50 %s p99 %s; answer to return p50 %s p99 %s",
				work, round+1, mode, n, r(lat[n/2]), r(lat[n*99/100]), r(wake[n/2]), r(wake[n*99/100]))
		}
	}
}
