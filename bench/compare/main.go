// Command compare runs the same workloads against Relay and River (and
// the floor: bench.Floor, the fewest statements a leased queue must run; and
// Relay's workflows against DBOS's) on one
// PostgreSQL, alternating the two (A B A B), and prints every figure with
// the Relay/River ratio. It is its own module so that Relay does not depend
// on River.
//
//	cd bench/compare && go run . [--database-url URL] [--workloads 1,2,3,4] [--rounds 2]
//
// Workloads (docs/benchmarks.md has the figures):
//
//  1. burn-down: 1,000,000 no-op jobs inserted in batches of 5,000, then drained;
//  2. steady: 1,000 jobs/s offered for 60 s, pickup and end-to-end latency;
//  3. slots: 3,000 jobs that sleep 10 ms and hash 1,000 rounds, at 1, 4 and
//     12 (3 processes × 4) slots, against the limit slots ÷ 10 ms;
//  4. scale: drain 100,000 jobs from a table holding 5,000,000 finished rows,
//     against the same drain on an empty table.
//
// and the same against DBOS Transact Go v1.8.0, for durable workflows (a
// chain of three no-op steps; each measurement in a process of its own):
//
//  5. queued: 20,000 runs started up front, then drained: runs/s, steps/s
//     (beside DBOS and the workflow floor, bench.WorkflowFloor);
//  6. latency: 32 callers, then one, each starting a run and waiting for its
//     result: p50, p99;
//  7. suspension: the chain with a Sleep(0) between steps, and with each
//     step a child run, queued as in 5;
//  9. starts: 20,000 runs started by 16 callers, none executed: Relay's
//     Start (each its own transaction), 500 Starts per transaction, and
//     StartMany of 500, beside DBOS's enqueue;
//
// and, only when named (--workloads 8):
//
//  8. steady sweep: River beside Relay at each ClaimCoalesce of
//     --sweep-windows, at each rate of --sweep-rates: PostgreSQL CPU per
//     job against pickup latency.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/bench"
	"github.com/relayq/relay/testkit/devpg"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		err = bench.RunChild(ctx, os.Args[2:], []bench.System{bench.Relay{}, &River{}, bench.Floor{}})
	} else if len(os.Args) > 1 && os.Args[1] == "wf" {
		err = bench.RunWorkflowChild(ctx, os.Args[2:], workflowSystems())
	} else {
		err = run(ctx, os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

type options struct {
	url       string
	workloads string
	rounds    int
	floor     bool

	w1Jobs                    int
	w1RelayWorkers, w1RiverW  int
	w2Rate                    int
	w2Duration                time.Duration
	w2Workers                 int
	w3Jobs                    int
	w4Fill, w4Jobs, w4Workers int

	wfRuns, wfSuspendRuns, wfWorkers int
	wfStartRuns, wfStartBatch        int
	wfCallers                        []int
	wfDuration, wfWarmup, wfDBOSPoll time.Duration
	wfHops                           bool

	sweepRates    []int
	sweepWindows  []time.Duration
	sweepDuration time.Duration
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.url, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default: a throwaway cluster with default settings)")
	fs.StringVar(&o.workloads, "workloads", "1,2,3,4,5,6,7,9", "which workloads to run (8, the steady-load sweep, only when named)")
	fs.IntVar(&o.rounds, "rounds", 2, "rounds per workload; each round runs Relay then River (then the floor)")
	fs.BoolVar(&o.floor, "floor", true, "workloads 1-4: also run the floor (bench.Floor: the minimal SQL of a leased queue, no library), Relay's figures then also as a ratio of the floor's; workloads 5 and 9 likewise with the workflow floor (bench.WorkflowFloor: the fewest writes of a durable 3-step run)")
	fs.IntVar(&o.w1Jobs, "w1-jobs", 1_000_000, "workload 1: jobs")
	fs.IntVar(&o.w1RelayWorkers, "w1-relay-workers", 2000, "workload 1: Relay's workers")
	fs.IntVar(&o.w1RiverW, "w1-river-workers", 2000, "workload 1: River's workers (riverbench uses 2,000)")
	fs.IntVar(&o.w2Rate, "w2-rate", 1000, "workload 2: jobs/s offered")
	fs.DurationVar(&o.w2Duration, "w2-duration", 60*time.Second, "workload 2: duration")
	fs.IntVar(&o.w2Workers, "w2-workers", 100, "workload 2: workers (both)")
	fs.IntVar(&o.w3Jobs, "w3-jobs", 3000, "workload 3: jobs")
	fs.IntVar(&o.w4Fill, "w4-fill", 5_000_000, "workload 4: finished rows in the table")
	fs.IntVar(&o.w4Jobs, "w4-jobs", 100_000, "workload 4: jobs drained")
	fs.IntVar(&o.w4Workers, "w4-workers", 100, "workload 4: workers (both)")
	fs.IntVar(&o.wfRuns, "wf-runs", 20_000, "workflow workload 5: runs started up front, then drained")
	fs.IntVar(&o.wfSuspendRuns, "wf-suspend-runs", 5_000, "workflow workload 7: runs of each suspending shape")
	fs.IntVar(&o.wfStartRuns, "wf-start-runs", 20_000, "workflow workload 9: runs started")
	fs.IntVar(&o.wfStartBatch, "wf-start-batch", 500, "workflow workload 9: runs per transaction (Relay's batched starts and StartMany)")
	fs.IntVar(&o.wfWorkers, "wf-workers", 100, "workflow workloads 5 and 7: runs executed at once (both)")
	callers := fs.String("wf-callers", "32,1", "workflow workload 6: caller counts")
	rates := fs.String("sweep-rates", "1000,5000", "workload 8: steady rates (jobs/s)")
	windows := fs.String("sweep-windows", "off,1ms,2ms,5ms,10ms", "workload 8: Relay's ClaimCoalesce settings (off: a claim per notification; default: the client's default)")
	fs.DurationVar(&o.sweepDuration, "sweep-duration", 20*time.Second, "workload 8: how long each rate is offered, per run")
	fs.DurationVar(&o.wfDuration, "wf-duration", 15*time.Second, "workflow workload 6: how long callers run, per caller count")
	fs.DurationVar(&o.wfWarmup, "wf-warmup", 2*time.Second, "workflow workload 6: calls before recording")
	fs.BoolVar(&o.wfHops, "wf-hops", false, "workflow workload 6: Relay times each hop of every call (start, claim, checkpoints, outcome, result) and prints each hop's p50 and p99 (a diagnostic; it adds work to each call)")
	fs.DurationVar(&o.wfDBOSPoll, "wf-dbos-poll", 10*time.Millisecond, "workflow workloads: DBOS's queue polling interval (its default is 1s)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, c := range strings.Split(*callers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 {
			return fmt.Errorf("--wf-callers: %q is not a positive count", c)
		}
		o.wfCallers = append(o.wfCallers, n)
	}
	for _, r := range strings.Split(*rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n < 1 {
			return fmt.Errorf("--sweep-rates: %q is not a positive rate", r)
		}
		o.sweepRates = append(o.sweepRates, n)
	}
	for _, w := range strings.Split(*windows, ",") {
		switch w = strings.TrimSpace(w); w {
		case "off":
			o.sweepWindows = append(o.sweepWindows, -1)
		case "default":
			o.sweepWindows = append(o.sweepWindows, 0)
		default:
			d, err := time.ParseDuration(w)
			if err != nil || d <= 0 {
				return fmt.Errorf("--sweep-windows: %q is not off, default or a positive duration", w)
			}
			o.sweepWindows = append(o.sweepWindows, d)
		}
	}
	if o.url == "" {
		fmt.Println("compare: starting a throwaway PostgreSQL cluster (default settings, fsync on)")
		cluster, err := devpg.Start(ctx, devpg.Options{})
		if err != nil {
			return err
		}
		defer cluster.Stop()
		o.url = cluster.URL
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	want := strings.Split(o.workloads, ",")
	systems := []bench.System{bench.Relay{}, &River{}}
	if o.floor {
		systems = append(systems, bench.Floor{})
	}
	envs := map[string]bench.Env{}
	for _, sys := range systems {
		if !slices.ContainsFunc(want, func(w string) bool { return (w >= "1" && w <= "4") || w == "8" }) {
			break // the workflow workloads open their own schemas
		}
		u, err := schema(ctx, o.url, "bench_"+sys.Name())
		if err != nil {
			return err
		}
		pool, err := bench.NewPool(ctx, u)
		if err != nil {
			return err
		}
		defer pool.Close()
		if err := sys.Setup(ctx, pool); err != nil {
			return fmt.Errorf("%s setup: %w", sys.Name(), err)
		}
		envs[sys.Name()] = bench.Env{Pool: pool, URL: u, Out: os.Stdout,
			Spawn: func(a []string) *exec.Cmd { return exec.Command(self, append([]string{"worker"}, a...)...) }}
	}
	machinePool, err := bench.NewPool(ctx, o.url)
	if err != nil {
		return err
	}
	defer machinePool.Close()
	fmt.Printf("compare: %s\n", bench.Machine(ctx, machinePool))
	fmt.Printf("compare: %d round(s) per workload, Relay then the other in each\n", o.rounds)

	c := &comparison{o: o, systems: systems, envs: envs, self: self}
	for _, w := range []struct {
		id  string
		run func(context.Context) error
	}{{"1", c.burnDown}, {"2", c.steady}, {"3", c.slots}, {"4", c.scale},
		{"5", c.wfQueued}, {"6", c.wfLatency}, {"7", c.wfSuspend}, {"8", c.steadySweep}, {"9", c.wfStarts}} {
		if slices.Contains(want, w.id) {
			if err := w.run(ctx); err != nil {
				return fmt.Errorf("workload %s: %w", w.id, err)
			}
		}
	}
	c.summary()
	return nil
}

// schema creates (afresh) a schema and returns a URL whose connections use
// it.
func schema(ctx context.Context, url, name string) (string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf("DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s", name, name)); err != nil {
		return "", err
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + name, nil
}
