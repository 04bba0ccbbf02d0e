package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/relayq/relay/bench"
)

// River is the bench.System for github.com/riverqueue/river with its pgx
// driver, configured as River's own benchmark (cmd/river/riverbench)
// configures it for throughput: FetchCooldown 2ms, FetchPollInterval 20ms;
// bulk inserts through InsertManyFast (COPY FROM).
type River struct {
	mu      sync.Mutex
	inserts map[*pgxpool.Pool]*river.Client[pgx.Tx]
}

type riverArgs struct {
	Stamp int64 `json:"s"`
}

func (riverArgs) Kind() string { return "bench" }

func (*River) Name() string  { return "river" }
func (*River) Table() string { return "river_job" }

func riverConfig(cfg bench.WorkerConfig, ws *river.Workers) *river.Config {
	return &river.Config{
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.Workers}},
		Workers:           ws,
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func (*River) Describe(cfg bench.WorkerConfig) string {
	return fmt.Sprintf("v0.51.2, riverpgxv5; MaxWorkers %d, FetchCooldown 2ms, FetchPollInterval 20ms (riverbench's tuning); InsertManyFast (COPY) for batches; no prefetch setting",
		cfg.Workers)
}

func (*River) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

func (*River) Reset(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `TRUNCATE river_job`)
	return err
}

// inserter is an insert-only client on pool.
func (r *River) inserter(pool *pgxpool.Pool) (*river.Client[pgx.Tx], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.inserts[pool]; ok {
		return c, nil
	}
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	if r.inserts == nil {
		r.inserts = map[*pgxpool.Pool]*river.Client[pgx.Tx]{}
	}
	r.inserts[pool] = c
	return c, nil
}

func (r *River) InsertBatch(ctx context.Context, pool *pgxpool.Pool, n int) error {
	c, err := r.inserter(pool)
	if err != nil {
		return err
	}
	stamp := time.Now().UnixNano()
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: riverArgs{Stamp: stamp}}
	}
	_, err = c.InsertManyFast(ctx, params)
	return err
}

func (r *River) InsertOne(ctx context.Context, pool *pgxpool.Pool, stamp time.Time) error {
	c, err := r.inserter(pool)
	if err != nil {
		return err
	}
	_, err = c.Insert(ctx, riverArgs{Stamp: stamp.UnixNano()}, nil)
	return err
}

func (*River) FillFinished(ctx context.Context, pool *pgxpool.Pool, n int) error {
	_, err := pool.Exec(ctx, fmt.Sprintf(`
		INSERT INTO river_job (args, kind, max_attempts, state, attempt, attempted_at, finalized_at, scheduled_at, queue, priority)
		SELECT '{"s":0}', 'fill', 25, 'completed', 1, now(), now(), now(), 'default', 1 FROM generate_series(1, %d)`, n))
	return err
}

func (*River) EndToEnd(ctx context.Context, pool *pgxpool.Pool) (p50, p95, p99 time.Duration, err error) {
	return bench.EndToEndQuery(ctx, pool, `
		SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM finalized_at - created_at))
		FROM river_job WHERE state = 'completed' AND kind = 'bench'`)
}

func (*River) Work(ctx context.Context, pool *pgxpool.Pool, cfg bench.WorkerConfig, hooks bench.Hooks) error {
	ws := river.NewWorkers()
	river.AddWorker(ws, river.WorkFunc(func(_ context.Context, j *river.Job[riverArgs]) error {
		hooks.Started(j.Args.Stamp)
		hooks.Worked(cfg.Job.Do())
		return nil
	}))
	client, err := river.NewClient(riverpgxv5.New(pool), riverConfig(cfg, ws))
	if err != nil {
		return err
	}
	// Completions are counted from River's subscription, which reports a
	// job once its completion is stored (as riverbench counts them).
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: 100_000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted},
	})
	defer cancel()
	var done int64
	counted := make(chan struct{})
	go func() {
		defer close(counted)
		for ev := range events {
			if ev == nil {
				return
			}
			done++
			hooks.Completed(done)
		}
	}()
	if err := client.Start(ctx); err != nil {
		return err
	}
	hooks.CallReady()
	<-ctx.Done()
	stopCtx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	err = client.Stop(stopCtx)
	cancel()
	<-counted
	return err
}
