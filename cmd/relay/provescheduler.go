package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/scheduler"
)

// proveScheduleName is the schedule every process of the proof declares.
const proveScheduleName = "prove"

type proveTickArgs struct{}

func (proveTickArgs) Kind() string { return "prove.tick" }

// runProveScheduler is `relay prove scheduler`: P processes fire one
// schedule for a while, some are killed with SIGKILL, and an audit in SQL
// checks that every fire time got exactly one job.
func runProveScheduler(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prove scheduler", flag.ContinueOnError)
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL; the proof runs in a fresh schema of its own (default: a throwaway cluster)")
	processes := fs.Int("processes", 3, "scheduler OS processes")
	spec := fs.String("spec", "@every 1s", "the schedule's cron spec")
	duration := fs.Duration("duration", 30*time.Second, "how long the processes run")
	kills := fs.Int("kill", 0, "SIGKILL a random process this many times (spread over the first 70% of the run), restarting it")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	keep := fs.Bool("keep", false, "keep the proof's schema afterwards")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *processes < 1 || *kills < 0 || *duration <= 0 {
		return errors.New("prove scheduler: --processes must be ≥ 1, --kill ≥ 0, --duration > 0")
	}
	sched := scheduler.Schedule{Name: proveScheduleName, Spec: *spec, Args: proveTickArgs{}}
	parsed, err := scheduler.ParseSpec(*spec, nil)
	if err != nil {
		return fmt.Errorf("prove scheduler: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	db, err := openProofDB(ctx, *dbURL, *keep)
	if err != nil {
		return fmt.Errorf("prove scheduler: %w", err)
	}
	defer db.Close()
	pool, schemaURL := db.Pool, db.URL

	// Declare once here, so the first fire time is known before any
	// process runs; the processes redeclare the same schedule, which keeps
	// it.
	decl, err := scheduler.New(pool, &scheduler.Config{Schedules: []scheduler.Schedule{sched}})
	if err != nil {
		return err
	}
	if err := decl.Declare(ctx); err != nil {
		return err
	}
	var first time.Time
	if err := pool.QueryRow(ctx, `SELECT next_fire_at FROM relay_schedules WHERE name = $1`, proveScheduleName).Scan(&first); err != nil {
		return fmt.Errorf("prove scheduler: read first fire: %w", err)
	}
	fmt.Printf("prove: schedule %q, %d processes, %s, %d kills; first fire %s\n",
		*spec, *processes, *duration, *kills, first.UTC().Format(time.RFC3339))

	fleet := &workerFleet{argv: func(id string) []string {
		return []string{"prove-scheduler", "--database-url", schemaURL, "--spec", *spec}
	}}
	defer fleet.stopAll()
	for i := 0; i < *processes; i++ {
		if err := fleet.start(i); err != nil {
			return err
		}
	}

	start := time.Now()
	done := 0
	for i := 1; i <= *kills; i++ {
		at := start.Add(time.Duration(float64(*duration) * 0.7 * float64(i) / float64(*kills+1)))
		if err := sleepUntil(ctx, at); err != nil {
			return err
		}
		if err := fleet.kill(nil); err != nil {
			return err
		}
		done++
		fmt.Printf("prove: killed a scheduler process (%d/%d) at %s\n", done, *kills, time.Since(start).Round(time.Millisecond))
	}
	if err := sleepUntil(ctx, start.Add(*duration)); err != nil {
		return err
	}

	// Let the survivors handle every fire due by now, then stop them all.
	var end time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&end); err != nil {
		return err
	}
	for {
		var caughtUp bool
		if err := pool.QueryRow(ctx, `SELECT next_fire_at > $2 FROM relay_schedules WHERE name = $1`, proveScheduleName, end).Scan(&caughtUp); err != nil {
			return fmt.Errorf("prove scheduler: %w", err)
		}
		if caughtUp {
			break
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return fmt.Errorf("prove scheduler: fires due by the end were never handled: %w", err)
		}
	}
	fleet.stopAll()

	// Expected: every fire from the first up to (not including) the next
	// unhandled one, as the library computes them.
	var next time.Time
	if err := pool.QueryRow(ctx, `SELECT next_fire_at FROM relay_schedules WHERE name = $1`, proveScheduleName).Scan(&next); err != nil {
		return err
	}
	var expected []time.Time
	for f := first; f.Before(next); f = parsed.Next(f) {
		expected = append(expected, f)
	}
	var enqueued, duplicates, missed, unexpected int
	var lateP50, lateMax float64
	err = pool.QueryRow(ctx, sqlProveScheduleAudit, proveScheduleName, expected).Scan(&enqueued, &lateP50, &lateMax, &duplicates, &missed, &unexpected)
	if err != nil {
		return fmt.Errorf("prove scheduler: audit: %w", err)
	}
	fmt.Printf("prove: enqueue lateness after the fire time: p50 %.1fms, max %.1fms\n", lateP50, lateMax)
	fmt.Printf("proof: schedule fires_expected=%d enqueued=%d duplicates=%d missed=%d unexpected=%d kills=%d processes=%d elapsed=%s\n",
		len(expected), enqueued, duplicates, missed, unexpected, done, *processes, time.Since(start).Round(time.Millisecond))
	if duplicates != 0 || missed != 0 || unexpected != 0 || len(expected) == 0 {
		return errors.New("prove scheduler: the audit failed")
	}
	return nil
}

// sqlProveScheduleAudit counts, over the jobs the schedule enqueued: distinct
// fire times, the median and worst delay from fire time to enqueue, extra jobs for a fire time already covered, expected fire times
// with no job, and jobs for fire times not expected.
const sqlProveScheduleAudit = `
WITH jobs AS (
    SELECT (metadata->>'relay.fire_time')::timestamptz AS fire_time, created_at
    FROM relay_jobs WHERE metadata->>'relay.schedule' = $1
), expected AS (
    SELECT unnest($2::timestamptz[]) AS fire_time
)
SELECT
    (SELECT count(DISTINCT fire_time) FROM jobs),
    (SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM created_at - fire_time)), 0) * 1000 FROM jobs),
    (SELECT coalesce(max(extract(epoch FROM created_at - fire_time)), 0) * 1000 FROM jobs),
    (SELECT count(*) - count(DISTINCT fire_time) FROM jobs),
    (SELECT count(*) FROM expected e WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.fire_time = e.fire_time)),
    (SELECT count(*) FROM jobs j WHERE NOT EXISTS (SELECT 1 FROM expected e WHERE e.fire_time = j.fire_time))`

// runProveSchedulerProcess is one process of `relay prove scheduler`. It
// runs a Scheduler declaring the proof's schedule until SIGTERM.
func runProveSchedulerProcess(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prove-scheduler", flag.ContinueOnError)
	url := fs.String("database-url", "", "PostgreSQL URL")
	spec := fs.String("spec", "@every 1s", "cron spec")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	pool, err := pgxpool.New(context.WithoutCancel(ctx), *url)
	if err != nil {
		return err
	}
	defer pool.Close()
	s, err := scheduler.New(pool, &scheduler.Config{
		Schedules: []scheduler.Schedule{{Name: proveScheduleName, Spec: *spec, Args: proveTickArgs{}}},
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		return err
	}
	if err := s.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.Stop(stopCtx)
}

func sleepUntil(ctx context.Context, t time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(t)):
		return nil
	}
}
