package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/bench"
	"github.com/relayq/relay/core"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/workflow"
)

// benchWFQueue is the queue the workflow curves' runs execute on.
const benchWFQueue = "bench"

// curveEngine is a registry and a core client executing its runs, on a
// pool of its own, in this process.
type curveEngine struct {
	pool   *pgxpool.Pool // the harness's: starts and statistics
	wpool  *pgxpool.Pool // the client's
	reg    *workflow.Registry
	client *core.Client
}

func openCurveEngine(ctx context.Context, url string, workers int) (*curveEngine, error) {
	e := &curveEngine{}
	var err error
	if e.pool, err = bench.NewPool(ctx, url); err != nil {
		return nil, err
	}
	if _, err := migrations.Migrate(ctx, e.pool); err != nil {
		e.pool.Close()
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		e.pool.Close()
		return nil, err
	}
	cfg.MaxConns = int32(max(8, min(workers+4, 40)))
	if e.wpool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		e.pool.Close()
		return nil, err
	}
	e.reg = workflow.NewRegistry(e.wpool, &workflow.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	return e, nil
}

// start starts the client that executes the registry's runs.
func (e *curveEngine) start(ctx context.Context, workers int) error {
	ws := core.NewWorkers()
	if err := e.reg.AddWorkers(ws); err != nil {
		return err
	}
	var err error
	e.client, err = core.NewClient(e.wpool, &core.Config{Workers: ws, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Queues: map[string]core.QueueConfig{benchWFQueue: {MaxWorkers: workers}}})
	if err != nil {
		return err
	}
	return e.client.Start(ctx)
}

func (e *curveEngine) close() {
	if e.client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		e.client.Stop(ctx) //nolint:errcheck
		cancel()
	}
	e.wpool.Close()
	e.pool.Close()
}

// runBenchSleepers is `relay bench --sleepers N --wake-within D`: N
// workflow runs each sleep (SleepUntil) to a wake time spread evenly over
// D, then run one step. It reports how late each run's step started after
// its wake time, whether the wakes kept up, and PostgreSQL's CPU per run
// over the wake window.
func runBenchSleepers(ctx context.Context, url string, n int, within time.Duration, workers int) error {
	e, err := openCurveEngine(ctx, url, workers)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer e.close()
	var late bench.Histogram
	var lateMu sync.Mutex
	var woken atomic.Int64
	noop := func(context.Context) (int, error) { return 0, nil }
	wf := workflow.MustRegister(e.reg, "bench.sleeper", func(wctx workflow.Context, wakeAt int64) (int, error) {
		if _, err := workflow.Step(wctx, "a", noop, nil); err != nil {
			return 0, err
		}
		if err := workflow.SleepUntil(wctx, "z", time.Unix(0, wakeAt)); err != nil {
			return 0, err
		}
		return workflow.Step(wctx, "b", func(context.Context) (int, error) {
			lateMu.Lock()
			late.Record(time.Since(time.Unix(0, wakeAt)))
			lateMu.Unlock()
			woken.Add(1)
			return 0, nil
		}, nil)
	})
	if err := e.start(ctx, workers); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	// Every run is started, executed to its sleep and suspended before the
	// first wakes: a lead of 2 s plus 1.5 ms per run (checked below).
	lead := 2*time.Second + time.Duration(n)*1500*time.Microsecond
	t0 := time.Now().Add(lead)
	fmt.Printf("bench: %d sleeping runs (a step, SleepUntil, a step) waking evenly over %s from +%s; a core client with MaxWorkers %d executes them\n", n, within, lead.Round(time.Second), workers)
	began := time.Now()
	const batch = 1000
	for i := 0; i < n; i += batch {
		runs := make([]workflow.StartParams[int64], 0, batch)
		for j := i; j < min(i+batch, n); j++ {
			wake := t0.Add(time.Duration(int64(within) * int64(j) / int64(n)))
			runs = append(runs, workflow.StartParams[int64]{Input: wake.UnixNano(), Opts: &workflow.StartOpts{Queue: benchWFQueue}})
		}
		if _, err := workflow.StartMany(ctx, e.pool, wf, runs); err != nil {
			return fmt.Errorf("bench: start: %w", err)
		}
	}
	fmt.Printf("  started %d runs in %s\n", n, time.Since(began).Round(time.Millisecond))
	// Wait until every run sleeps: its job queued with a run_at ahead.
	for {
		var asleep int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM relay_jobs WHERE queue = $1 AND state = 'queued' AND run_at > now()`, benchWFQueue).Scan(&asleep); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if asleep == n {
			break
		}
		if time.Now().After(t0) {
			return fmt.Errorf("bench: only %d of %d runs asleep when the first was due: give them a longer lead", asleep, n)
		}
		if err := pause(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	fmt.Printf("  all %d asleep %s before the first wake\n", n, time.Until(t0).Round(time.Millisecond))
	if err := sleepUntil(ctx, t0); err != nil {
		return err
	}
	cpu0, _ := bench.PostgresCPU(ctx, e.pool)
	deadline := t0.Add(within + 2*time.Minute)
	for woken.Load() < int64(n) {
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: %d of %d runs woke within %s of the last wake time", woken.Load(), n, 2*time.Minute)
		}
		if err := pause(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
	lastWake := t0.Add(within)
	over := time.Since(lastWake)
	cpu, _ := bench.PostgresCPU(ctx, e.pool)
	lateMu.Lock()
	defer lateMu.Unlock()
	fmt.Printf("bench: mode=sleepers runs=%d within=%s workers=%d late_p50_ms=%.2f late_p99_ms=%.2f late_max_ms=%.1f last_after_last_wake_ms=%.1f pg_cpu_ms_per_1k=%.2f\n",
		n, within, workers, ms(late.Quantile(0.5)), ms(late.Quantile(0.99)), ms(late.Quantile(1)), ms(over), ms((cpu-cpu0)*1000/time.Duration(n)))
	return nil
}

// runBenchHistory is `relay bench --history N --wakes W`: one workflow
// run of N no-op steps in one execution, then W times a Sleep(0) and a
// step: each wake-up replays the whole history. It reports the steps' rate
// and PostgreSQL's CPU per step, how long the first wake-up took (until
// its step ran) and the mean of the later ones, and PostgreSQL's CPU per
// wake-up.
func runBenchHistory(ctx context.Context, url string, n, wakes int) error {
	e, err := openCurveEngine(ctx, url, 4)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer e.close()
	var first, loopDone atomic.Int64
	woke := make([]atomic.Int64, wakes)
	noop := func(context.Context) (int, error) { return 0, nil }
	wf := workflow.MustRegister(e.reg, "bench.history", func(wctx workflow.Context, n int) (int, error) {
		for i := range n {
			fn := noop
			if i == 0 {
				fn = func(context.Context) (int, error) { first.Store(time.Now().UnixNano()); return 0, nil }
			}
			if _, err := workflow.Step(wctx, fmt.Sprintf("s%d", i), fn, nil); err != nil {
				return 0, err
			}
		}
		if _, err := workflow.Step(wctx, "done", func(context.Context) (int, error) { loopDone.Store(time.Now().UnixNano()); return 0, nil }, nil); err != nil {
			return 0, err
		}
		for w := range wakes {
			key := "z"
			if w > 0 {
				key = fmt.Sprintf("z%d", w)
			}
			if err := workflow.Sleep(wctx, key, 0); err != nil {
				return 0, err
			}
			if _, err := workflow.Step(wctx, fmt.Sprintf("end%d", w), func(context.Context) (int, error) { woke[w].Store(time.Now().UnixNano()); return 0, nil }, nil); err != nil {
				return 0, err
			}
		}
		return 0, nil
	})
	if err := e.start(ctx, 4); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	cpu0, _ := bench.PostgresCPU(ctx, e.pool)
	read0 := e.reg.Stats().HistoryRead // the first execution reads none
	h, err := workflow.Start(ctx, e.pool, wf, n, &workflow.StartOpts{Queue: benchWFQueue})
	if err != nil {
		return fmt.Errorf("bench: start: %w", err)
	}
	var cpuLoop time.Duration
	deadline := time.Now().Add(9 * time.Minute)
	for loopDone.Load() == 0 {
		if time.Now().After(deadline) {
			return errors.New("bench: the run's steps did not finish within 9 minutes")
		}
		if err := pause(ctx, time.Millisecond); err != nil {
			return err
		}
	}
	cpuLoop, _ = bench.PostgresCPU(ctx, e.pool)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if _, err := h.Result(rctx, e.pool); err != nil {
		return fmt.Errorf("bench: result: %w", err)
	}
	cpuEnd, _ := bench.PostgresCPU(ctx, e.pool)
	steps := time.Duration(loopDone.Load() - first.Load())
	replay := time.Duration(woke[0].Load() - loopDone.Load())
	var later time.Duration
	if wakes > 1 {
		later = time.Duration(woke[wakes-1].Load()-woke[0].Load()) / time.Duration(wakes-1)
	}
	fmt.Printf("bench: mode=history steps=%d wakes=%d steps_per_s=%.0f step_mean_ms=%.3f pg_cpu_ms_per_1k_steps=%.2f replay_ms=%.1f later_replay_ms=%.1f pg_cpu_ms_per_wake=%.1f history_rows_read_per_wake=%d\n",
		n, wakes, float64(n)/steps.Seconds(), ms(steps)/float64(n), ms((cpuLoop-cpu0)*1000/time.Duration(n)), ms(replay), ms(later),
		ms((cpuEnd-cpuLoop)/time.Duration(wakes)), (e.reg.Stats().HistoryRead-read0)/int64(wakes))
	return nil
}

// pause waits d, or until ctx is done.
func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
