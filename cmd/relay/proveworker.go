package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
)

// proveArgs is the proof's job: run for Ms milliseconds.
type proveArgs struct {
	Seq int `json:"seq"`
	Ms  int `json:"ms"`
}

func (proveArgs) Kind() string { return "prove.job" }

const proveQueue = "prove"

// proveWorker is the proof's handler. It records that the attempt started
// (committed on its own, whatever happens next), works, then writes its
// effect and the job's success in one transaction.
type proveWorker struct {
	pool *pgxpool.Pool
	id   string
	sink *sinkClient // nil: no outside observer
	// workFirst: the work comes before the attempt's record (which then
	// carries the handler's start time), as in a handler whose first act
	// is a call to an outside service: nothing the database sees makes the
	// claim durable before the work.
	workFirst bool
}

func (w *proveWorker) Work(ctx context.Context, job *core.Job[proveArgs]) error {
	// The outside observer hears of the attempt before it does anything, and
	// of its end before the handler's bookkeeping below (which may wait for
	// a database that is unreachable) and before it returns.
	if err := w.sink.report("start", job.ID, job.Attempt); err != nil {
		return err
	}
	reported := false
	endReport := func() {
		if !reported {
			reported = true
			w.sink.report("end", job.ID, job.Attempt) //nolint:errcheck // a missing end counts as an overlap: never hidden
		}
	}
	defer endReport()
	// ended records the end of a failed attempt: where (its row's id) and
	// args. The handler does not return before it is recorded (the
	// database may be restarting), so the audit never mistakes an attempt
	// that ended for one still running.
	ended := func(where string, args ...any) {
		endReport()
		for try := 0; try < 100; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := w.pool.Exec(ctx, `UPDATE prove_attempts SET ended_at = clock_timestamp() WHERE ended_at IS NULL AND `+where, args...)
			cancel()
			if err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	started := time.Now()
	var attemptID int64
	record := func() error {
		if err := w.pool.QueryRow(ctx, `INSERT INTO prove_attempts (job_id, attempt, worker, started_at) VALUES ($1, $2, $3, $4) RETURNING id`,
			job.ID, job.Attempt, w.id, started).Scan(&attemptID); err != nil {
			// The row may have been written even so: a connection lost (a
			// PostgreSQL crash) after the commit, before its answer. It
			// would read as an attempt still running, overlapping the next.
			ended(`job_id = $1 AND attempt = $2 AND worker = $3`, job.ID, job.Attempt, w.id)
			return fmt.Errorf("record attempt start: %w", err)
		}
		return nil
	}
	if !w.workFirst {
		if err := record(); err != nil {
			return err
		}
	}
	select {
	case <-time.After(time.Duration(job.Args.Ms) * time.Millisecond):
	case <-ctx.Done():
		if w.workFirst {
			endReport()
			w.recordEnded(job, started)
			return context.Cause(ctx)
		}
		ended(`id = $1`, attemptID)
		return context.Cause(ctx)
	}
	if w.workFirst {
		if err := record(); err != nil {
			return err
		}
	}
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO prove_effects (job_id, attempt_id) VALUES ($1, $2)`, job.ID, attemptID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE prove_attempts SET ended_at = clock_timestamp() WHERE id = $1`, attemptID); err != nil {
			return err
		}
		return core.CompleteTx(ctx, tx, job)
	})
	if err != nil {
		ended(`id = $1`, attemptID)
	}
	return err
}

// recordEnded records an attempt that ended before it was recorded (a
// workFirst handler cancelled during its work), retrying as ended does.
func (w *proveWorker) recordEnded(job *core.Job[proveArgs], started time.Time) {
	for try := 0; try < 100; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := w.pool.Exec(ctx, `INSERT INTO prove_attempts (job_id, attempt, worker, started_at, ended_at) VALUES ($1, $2, $3, $4, clock_timestamp())`,
			job.ID, job.Attempt, w.id, started)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runProveWorker is one worker process of `relay prove queue` (started by it,
// not by users). It runs until SIGTERM, then drains.
func runProveWorker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prove-worker", flag.ContinueOnError)
	url := fs.String("database-url", "", "PostgreSQL URL")
	id := fs.String("id", "", "worker id")
	concurrency := fs.Int("concurrency", 8, "jobs at once")
	lease := fs.Duration("lease", 5*time.Second, "lease duration")
	drain := fs.Duration("drain", 10*time.Second, "graceful stop timeout")
	sink := fs.String("sink", "", "URL of the prover's sink, told of each attempt's start and end")
	appName := fs.String("app-name", "relay-prove-worker", "application_name of the worker's connections")
	workFirst := fs.Bool("work-before-write", false, "work before the attempt's first database write")
	syncClaims := fs.Bool("synchronous-claims", false, "claims commit synchronously (core.Config.SynchronousClaims)")
	listenerURL := fs.String("listener-url", "", "PostgreSQL URL of the LISTEN connection (default: --database-url's)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	sc := newSinkClient(*sink, *id)
	return runProofClientNamed(ctx, *url, *listenerURL, *appName, *id, *concurrency, *lease, *drain, *syncClaims, func(ws *core.Workers, pool *pgxpool.Pool) {
		core.MustAddWorker(ws, core.Worker[proveArgs](&proveWorker{pool: pool, id: *id, sink: sc, workFirst: *workFirst}))
	})
}

// runProofClient runs a worker process of a proof: a core client on the
// proof's queue with short leases and quick retries, with the workers
// register adds, until SIGTERM (main's signal context), then drains for at
// most drain.
func runProofClient(ctx context.Context, url, id string, concurrency int, lease, drain time.Duration, register func(*core.Workers, *pgxpool.Pool)) error {
	return runProofClientNamed(ctx, url, "", "relay-prove-worker", id, concurrency, lease, drain, false, register)
}

// runProofClientNamed is runProofClient whose connections carry appName
// (the queue proof names its run, so that --backend-kill hits no other),
// its claims committing synchronously if syncClaims, listening on
// listenerURL when set (core.Config.ListenerURL).
func runProofClientNamed(ctx context.Context, url, listenerURL, appName, id string, concurrency int, lease, drain time.Duration, syncClaims bool,
	register func(*core.Workers, *pgxpool.Pool)) error {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	cfg.MaxConns = int32(concurrency*2 + 4)
	pool, err := pgxpool.NewWithConfig(context.WithoutCancel(ctx), cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	ws := core.NewWorkers()
	register(ws, pool)
	client, err := core.NewClient(pool, &core.Config{
		Workers:        ws,
		ID:             id,
		ListenerURL:    listenerURL,
		Queues:         map[string]core.QueueConfig{proveQueue: {MaxWorkers: concurrency}},
		LeaseDuration:  lease,
		RescueInterval: lease / 4,
		PollInterval:   200 * time.Millisecond,
		RetryPolicy:    core.Backoff{Base: 50 * time.Millisecond, Max: time.Second},
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),

		SynchronousClaims: syncClaims,
	})
	if err != nil {
		return err
	}
	if err := client.Start(context.Background()); err != nil {
		return err
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintln(os.Stderr, "prove-worker:", err)
	}
	return nil
}
