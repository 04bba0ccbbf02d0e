// Command relay is Relay's command line: apply migrations, run the demo, and
// (as later parts land) run workers, serve the admin API, prove and bench.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/relayq/relay/internal/bench"
)

const usage = `relay — a job queue and workflow engine on PostgreSQL

Usage:
  relay migrate [--database-url URL]   apply pending migrations
  relay demo    [--database-url URL]   run the demo (a throwaway PostgreSQL when no URL)
  relay prove queue [flags]            prove no job is lost or its effect duplicated
                                       under kill -9, SIGTERM and database faults
                                       (relay prove queue -h lists the flags)
  relay prove scheduler [flags]        prove every fire time of a schedule gets exactly
                                       one job across processes under kill -9
  relay prove idempotency [flags]      prove each job's database effect happens once and
                                       its outside call keeps one token, under kill -9
  relay prove outbox [flags]           prove published events reach their subscribers once,
                                       in order per key, under kill -9
  relay bench [flags]                  measure throughput and latency: a burn-down of
                                       --jobs, or --rate jobs/s for --duration
                                       (relay bench -h lists the flags)

The database URL defaults to $DATABASE_URL.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "migrate":
		err = runMigrate(ctx, os.Args[2:])
	case "demo":
		err = runDemo(ctx, os.Args[2:])
	case "prove":
		err = runProve(ctx, os.Args[2:])
	case "prove-worker":
		err = runProveWorker(ctx, os.Args[2:])
	case "bench":
		err = runBench(ctx, os.Args[2:])
	case "bench-worker":
		err = bench.RunChild(ctx, os.Args[2:], []bench.System{bench.Relay{}})
	case "prove-outbox-worker":
		err = runProveOutboxWorker(ctx, os.Args[2:])
	case "prove-idem-worker":
		err = runProveIdemWorker(ctx, os.Args[2:])
	case "prove-scheduler":
		err = runProveSchedulerProcess(ctx, os.Args[2:])
	case "prove-workflow-worker":
		err = runProveWorkflowWorker(ctx, os.Args[2:])
	case "help", "-h", "--help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "relay: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
}
