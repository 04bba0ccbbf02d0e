package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/devpg"
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

// demoDir is where the demo keeps its own PostgreSQL cluster between `relay
// demo` and `relay demo --dashboard` when no database is given.
func demoDir() string { return filepath.Join(os.TempDir(), "relay-demo") }

// runDemo is `relay demo`: plain jobs, the payment workflow, a month-end
// schedule and outbox events, left in the database for the dashboard; with
// --dashboard, `relay serve` on that database instead.
func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	url := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default: the demo's own local cluster, kept in "+demoDir()+" for --dashboard)")
	dashboard := fs.Bool("dashboard", false, "serve the dashboard on the database the demo used, with a one-time login link, until Ctrl-C")
	listen := fs.String("listen", "127.0.0.1:8080", "with --dashboard: address to listen on (loopback)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fromFlag := *url != os.Getenv("DATABASE_URL")
	if *dashboard {
		return runDemoDashboard(ctx, *url, *listen)
	}
	start := time.Now()
	var cluster *devpg.Cluster
	if *url == "" {
		release, err := lockDemoDir()
		if err != nil {
			return err
		}
		defer release()
		fmt.Printf("demo: no DATABASE_URL; starting the demo's own PostgreSQL in %s (replaced at each demo, kept for --dashboard)\n", demoDir())
		if err := devpg.Discard(demoDir()); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if cluster, err = devpg.Start(ctx, devpg.Options{Dir: demoDir()}); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		defer func() {
			if err := cluster.Shutdown(); err != nil {
				fmt.Fprintln(os.Stderr, "demo:", err)
			}
		}()
		*url = cluster.URL
		fmt.Printf("demo: PostgreSQL at 127.0.0.1:%d\n", cluster.Port)
	} else {
		fmt.Println("demo: using --database-url / $DATABASE_URL; the relay_* tables, the demo's jobs, runs, schedule and events stay there afterwards")
	}
	pool, err := openPool(ctx, *url, false)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer pool.Close()
	res, err := migrations.Migrate(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Printf("demo: migrated (%d applied)\n", len(res.Applied))

	// A tracer provider, so that jobs and runs get trace ids (a real
	// program exports them: docs/observability.md).
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.WithoutCancel(ctx)) //nolint:errcheck
	t := &demoTour{pool: pool, tp: tp, stamp: strings.Replace(time.Now().UTC().Format("0102-150405.000"), ".", "", 1)}
	if err := t.setUp(ctx); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer t.stop()
	for _, step := range []func(context.Context) error{t.jobs, t.workflows, t.schedule, t.outbox} {
		if err := step(ctx); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}

	fmt.Printf("\ndemo: done in %s. Delivery is at-least-once: handlers must be idempotent.\n", time.Since(start).Round(100*time.Millisecond))
	fmt.Println("\nSee all of it in the dashboard (it prints a one-time login link):")
	switch {
	case cluster != nil:
		fmt.Println("  go run ./cmd/relay demo --dashboard")
	case fromFlag:
		fmt.Printf("  go run ./cmd/relay demo --dashboard --database-url '%s'\n", *url)
	default:
		fmt.Println("  go run ./cmd/relay demo --dashboard      # on $DATABASE_URL")
	}
	return nil
}

// runDemoDashboard serves the admin API and dashboard on the demo's
// database (url, else the demo's kept cluster) with a fresh secret, so that
// `relay serve` prints its one-time login link, until ctx ends.
func runDemoDashboard(ctx context.Context, url, listen string) error {
	if url == "" {
		if _, err := os.Stat(filepath.Join(demoDir(), "data")); err != nil {
			return errors.New("demo: no demo database in " + demoDir() + ": run `relay demo` first (or pass --database-url)")
		}
		release, err := lockDemoDir()
		if err != nil {
			return err
		}
		defer release()
		cluster, err := devpg.Start(ctx, devpg.Options{Dir: demoDir()})
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		defer func() {
			if err := cluster.Shutdown(); err != nil {
				fmt.Fprintln(os.Stderr, "demo:", err)
			}
		}()
		url = cluster.URL
		fmt.Printf("demo: the demo's PostgreSQL at 127.0.0.1:%d (in %s)\n", cluster.Port, demoDir())
	}
	if os.Getenv(secretEnv) == "" {
		b := make([]byte, 32)
		rand.Read(b)
		// This process's own secret: the login link below is the way in,
		// and `relay token` with the same secret mints more.
		os.Setenv(secretEnv, base64.StdEncoding.EncodeToString(b)) //nolint:errcheck
	}
	fmt.Println("demo: serving the dashboard on the demo's data until Ctrl-C")
	return runServe(ctx, []string{"--database-url", url, "--listen", listen, "--demo-workers"})
}

// demoQuiet is the demo's logger: failures are printed by the handlers.
func demoQuiet() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// waitJobs polls until every job is in a final state, bounded.
func waitJobs(ctx context.Context, pool *pgxpool.Pool, ids []int64, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var open int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_jobs WHERE id = ANY($1) AND state NOT IN ('succeeded','dead','cancelled')`, ids).Scan(&open); err != nil {
			return fmt.Errorf("wait for jobs: %w", err)
		}
		if open == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of jobs %v still unfinished after %s", open, ids, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// traceOf is the trace id of a job's stored traceparent, or "(untraced)".
func traceOf(j *core.JobRow) string {
	if id := traceID(metaString(j.Metadata, core.MetaTraceParent)); id != "" {
		return id
	}
	return "(untraced)"
}

// metaString reads one string of a job's metadata ("" if absent).
func metaString(meta []byte, key string) string {
	var m map[string]any
	json.Unmarshal(meta, &m) //nolint:errcheck // absent then
	v, _ := m[key].(string)
	return v
}
