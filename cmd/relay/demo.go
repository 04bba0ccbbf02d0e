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
	"github.com/relayq/relay/internal/devpg"
	"github.com/relayq/relay/migrations"
)

// The demo's three job kinds: one succeeds, one fails twice then succeeds,
// one always fails and ends dead.
type greetArgs struct {
	Name string `json:"name"`
}

func (greetArgs) Kind() string { return "demo.greet" }

type flakyArgs struct {
	FailTimes int `json:"fail_times"`
}

func (flakyArgs) Kind() string { return "demo.flaky" }

type doomedArgs struct{}

func (doomedArgs) Kind() string { return "demo.doomed" }

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	url := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default: a throwaway local cluster)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *url == "" {
		fmt.Println("demo: no DATABASE_URL; starting a throwaway PostgreSQL cluster (removed at the end)")
		cluster, err := devpg.Start(ctx, devpg.Options{})
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		defer func() {
			if err := cluster.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "demo:", err)
			}
		}()
		*url = cluster.URL
		fmt.Printf("demo: PostgreSQL at 127.0.0.1:%d (data in %s)\n", cluster.Port, cluster.Dir)
	} else {
		fmt.Println("demo: using --database-url / $DATABASE_URL; the relay_* tables and the demo's jobs stay there afterwards")
	}
	pool, err := pgxpool.New(ctx, *url)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer pool.Close()

	res, err := migrations.Migrate(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Printf("demo: migrated (%d applied)\n", len(res.Applied))

	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[greetArgs](func(ctx context.Context, j *core.Job[greetArgs]) error {
		fmt.Printf("  job %d %s: hello, %s\n", j.ID, j.Kind, j.Args.Name)
		return nil
	}))
	core.MustAddWorker(ws, core.WorkFunc[flakyArgs](func(ctx context.Context, j *core.Job[flakyArgs]) error {
		if j.Attempt <= j.Args.FailTimes {
			fmt.Printf("  job %d %s: attempt %d fails on purpose\n", j.ID, j.Kind, j.Attempt)
			return fmt.Errorf("upstream unavailable (attempt %d)", j.Attempt)
		}
		fmt.Printf("  job %d %s: attempt %d succeeds\n", j.ID, j.Kind, j.Attempt)
		return nil
	}))
	core.MustAddWorker(ws, core.WorkFunc[doomedArgs](func(ctx context.Context, j *core.Job[doomedArgs]) error {
		fmt.Printf("  job %d %s: attempt %d of %d fails\n", j.ID, j.Kind, j.Attempt, j.MaxAttempts)
		return errors.New("the card was declined")
	}))

	client, err := core.NewClient(pool, &core.Config{
		Workers:     ws,
		Queues:      map[string]core.QueueConfig{"demo": {MaxWorkers: 4}},
		RetryPolicy: core.Backoff{Base: 200 * time.Millisecond, Max: time.Second},
		// Failures are printed by the handlers; keep the log to errors.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		return err
	}

	// Enqueue inside our own transaction: the jobs exist only once it commits.
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	opts := &core.EnqueueOpts{Queue: "demo"}
	results, err := core.EnqueueMany(ctx, tx, []core.EnqueueParams{
		{Args: greetArgs{Name: "world"}, Opts: opts},
		{Args: flakyArgs{FailTimes: 2}, Opts: opts},
		{Args: doomedArgs{}, Opts: &core.EnqueueOpts{Queue: "demo", MaxAttempts: 3}},
	})
	if err != nil {
		tx.Rollback(ctx)
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	fmt.Printf("demo: enqueued jobs %d, %d, %d in one transaction; starting 4 workers on queue \"demo\"\n",
		results[0].ID, results[1].ID, results[2].ID)

	if err := client.Start(ctx); err != nil {
		return err
	}
	waitErr := waitFinal(ctx, pool, results)
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		return err
	}
	if waitErr != nil {
		return waitErr
	}

	fmt.Println("\ndemo: what happened to each job")
	for _, r := range results {
		j, err := core.JobGet(ctx, pool, r.ID)
		if err != nil {
			return err
		}
		fmt.Printf("  job %d %-11s %-9s after %d attempt(s)\n", j.ID, j.Kind, j.State, j.Attempt)
		for _, h := range j.History {
			fmt.Printf("      attempt %d failed: %s\n", h.Attempt, h.Error)
		}
	}
	fmt.Println("\ndemo: done. Delivery is at-least-once: handlers must be idempotent.")
	return nil
}

// waitFinal polls until every job is in a final state.
func waitFinal(ctx context.Context, pool *pgxpool.Pool, results []core.EnqueueResult) error {
	ids := make([]int64, len(results))
	for i, r := range results {
		ids[i] = r.ID
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var open int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_jobs WHERE id = ANY($1) AND state NOT IN ('succeeded','dead','cancelled')`, ids).Scan(&open)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if open == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: %d jobs still unfinished after 60s", open)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
