package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/bench"
	"github.com/relayq/relay/testkit/devpg"
)

// runBench is `relay bench`: a burn-down (pre-inserted jobs drained by
// worker processes) or, with --rate, a steady offered load. The last line is
// the machine-readable summary.
func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL; the bench runs in a fresh schema of its own (default: a throwaway cluster)")
	jobs := fs.Int("jobs", 100000, "burn-down: jobs to insert, then drain")
	workers := fs.Int("workers", 100, "jobs at once per worker process")
	processes := fs.Int("processes", 1, "worker OS processes")
	rate := fs.Int("rate", 0, "steady mode: jobs offered per second (0: burn-down mode)")
	duration := fs.Duration("duration", 30*time.Second, "steady mode: how long the rate is offered")
	jobSleep := fs.Duration("job-sleep", 0, "each handler sleeps this long")
	jobHash := fs.Int("job-hash", 0, "each handler runs this many rounds of SHA-256")
	fill := fs.Int("fill-finished", 0, "first fill the table with this many finished jobs (retention off: none is deleted during the run)")
	scheduled := fs.Int("fill-scheduled", 0, "first fill the table with this many queued jobs due in a day (scheduled work beside the measured jobs)")
	dueIn := fs.Duration("due-in", 0, "burn-down: the jobs all become due this long after their insert began (pickup and the drain count from then)")
	queues := fs.Int("queues", 1, "spread the jobs over this many queues, all served by each worker process (each with --workers/--queues slots, at least one)")
	cycleKeys := fs.Bool("cycle-keys", false, "--keys: give the jobs the keys in turn, not Zipf-distributed (as many distinct keys as jobs, up to --keys; none hot)")
	schedules := fs.Int("schedules", 0, "run a scheduler in this process with this many schedules, each firing every minute (a job of a kind and queue nobody serves)")
	sampleWaits := fs.Duration("sample-waits", 0, "steady mode: sample pg_stat_activity's wait events this often (10ms–100ms), counted per --window and over the run")
	backlog := fs.Int("key-backlog", 0, "first give one ordering key a running head and this many jobs queued behind it, ahead of the burn-down's jobs")
	keys := fs.Int("keys", 0, "give every job an ordering key among this many, Zipf-distributed (the outbox-shaped load); prints the order violations found")
	holdXmin := fs.Duration("hold-xmin", 0, "steady mode: an idle-in-transaction session holds the xmin horizon this long (from --hold-at); pickup is reported per --window")
	holdAt := fs.Duration("hold-at", 30*time.Second, "--hold-xmin: when the holder starts, after the offered load")
	window := fs.Duration("window", 0, "steady mode: also report pickup p50/p99 per window of this length (default 10s with --hold-xmin)")
	noFloor := fs.Bool("no-claim-floor", false, "turn the workers' claim floor off (core.Config.NoClaimFloor), for A/B runs")
	syncClaims := fs.Bool("synchronous-claims", false, "the workers' claims commit synchronously (core.Config.SynchronousClaims), for A/B runs")
	prefetch := fs.Int("prefetch", 0, "jobs each process may claim beyond --workers (QueueConfig.Prefetch)")
	coalesce := fs.Duration("claim-coalesce", 0, "Config.ClaimCoalesce of the worker processes (0: the default; negative: off, a claim per notification)")
	traced := fs.Bool("trace", false, "record every span (to a discarding exporter), to measure tracing's cost")
	system := fs.String("system", "relay", "the queue measured: relay, or floor (the fewest statements a leased queue must run, no library: what Relay is measured against; with --workflow, the fewest writes of a durable 3-step run)")
	wf := fs.Bool("workflow", false, "workflows instead of jobs: --runs three-step runs started up front and drained, then --callers callers each starting runs and waiting for their results")
	wfRuns := fs.Int("runs", 20000, "--workflow: runs started up front, then drained (0: skip)")
	wfShape := fs.String("shape", "chain", "--workflow: chain (3 no-op steps), sleep (a Sleep(0) between steps) or child (each step a child run)")
	wfCallers := fs.String("callers", "32,1", "--workflow: caller counts for the latency runs (empty: skip)")
	wfHops := fs.Bool("hops", false, "--workflow: time each hop of every latency call (start, claim, checkpoints, outcome, result) and print each hop's p50 and p99 (a diagnostic; it adds work to each call)")
	wfEager := fs.Bool("eager", false, "--workflow: run each latency measurement a second time with eager start (workflow.RunNow: the run executed in the caller's goroutine)")
	sleepers := fs.Int("sleepers", 0, "workflow runs that each sleep to a wake time spread over --wake-within, then run a step: how late they wake (its own measurement; the job flags do not apply)")
	wakeWithin := fs.Duration("wake-within", time.Minute, "--sleepers: the wake times are spread evenly over this long")
	schema := fs.String("schema", "", "run in this schema (created and migrated if absent) and keep it and its jobs: the table is not emptied first, so a fill made by one run stays beside the next runs")
	history := fs.Int("history", 0, "one workflow run of this many steps in one execution, then a Sleep(0) whose wake-up replays them (its own measurement)")
	wakes := fs.Int("wakes", 1, "--history: this many Sleep(0)s, each followed by a step, after the steps: every wake-up replays the history")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *sleepers > 0 || *history > 0 {
		if *sleepers > 0 && *history > 0 || *wakeWithin <= 0 {
			return errors.New("bench: --sleepers or --history, one at a time; --wake-within > 0")
		}
		db, err := openProofDB(ctx, *dbURL, false)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer db.Close()
		fmt.Printf("bench: %s\n", bench.Machine(ctx, db.Pool))
		if *history > 0 {
			return runBenchHistory(ctx, db.URL, *history, max(*wakes, 1))
		}
		return runBenchSleepers(ctx, db.URL, *sleepers, *wakeWithin, *workers)
	}
	if *wf {
		return runBenchWorkflow(ctx, *dbURL, *system, *wfRuns, *workers, *wfShape, *wfCallers, *duration, *wfEager, *wfHops)
	}
	if *jobs < 1 || *workers < 1 || *processes < 1 || *queues < 1 || *rate < 0 || *fill < 0 || *scheduled < 0 || *backlog < 0 || *keys < 0 || *schedules < 0 || *dueIn < 0 || *sampleWaits < 0 {
		return fmt.Errorf("bench: --jobs, --workers, --processes, --queues must be ≥ 1; --rate, --fill-finished, --fill-scheduled, --key-backlog, --keys, --schedules, --due-in, --sample-waits ≥ 0")
	}
	if *dueIn > 0 && *rate > 0 {
		return errors.New("bench: --due-in is a burn-down's (without --rate)")
	}
	if *traced {
		os.Setenv(bench.EnvTrace, "1") // the worker processes inherit it
		defer bench.InstallTracing()()
	}
	db, err := openProofDBIn(ctx, *dbURL, false, "", *schema)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer db.Close()
	pool, schemaURL := db.Pool, db.URL
	relaySys := bench.Relay{Queues: *queues}
	if *keys > 0 {
		relaySys.Keys = bench.NewKeyPicker(*keys)
		if *cycleKeys {
			relaySys.Keys = bench.NewCyclingKeyPicker(*keys)
		}
	}
	var sys bench.System = relaySys
	switch *system {
	case "relay":
	case "floor":
		if *keys > 0 || *backlog > 0 || *holdXmin > 0 || *queues > 1 || *scheduled > 0 || *dueIn > 0 || *schedules > 0 {
			return errors.New("bench: --system floor has no ordering keys, queues, run-at or schedules: --keys, --key-backlog, --hold-xmin, --queues, --fill-scheduled, --due-in and --schedules are Relay's")
		}
		sys = bench.Floor{}
	default:
		return fmt.Errorf("bench: --system %q: want relay or floor", *system)
	}
	if err := sys.Setup(ctx, pool); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	env := bench.Env{Pool: pool, URL: schemaURL, Out: os.Stdout,
		Spawn: func(a []string) *exec.Cmd { return exec.Command(self, append([]string{"bench-worker"}, a...)...) }}
	job := bench.Job{Sleep: *jobSleep, Hash: *jobHash}
	cfg := bench.WorkerConfig{Workers: *workers, Prefetch: *prefetch, Job: job, ClaimCoalesce: *coalesce, NoClaimFloor: *noFloor, SynchronousClaims: *syncClaims, Queues: *queues}
	fmt.Printf("bench: %s\nbench: %s: %s\n", bench.Machine(ctx, pool), sys.Name(), sys.Describe(cfg))

	var res bench.Result
	// What the measured jobs run beside: filled first, then vacuumed and
	// analyzed, and kept by the run.
	keep := *fill > 0 || *scheduled > 0 || *backlog > 0 || *schema != ""
	if keep && *schema == "" {
		if err := sys.Reset(ctx, pool); err != nil {
			return err
		}
	}
	if *fill > 0 {
		fmt.Printf("bench: filling the table with %d finished jobs\n", *fill)
		if err := sys.FillFinished(ctx, pool, *fill); err != nil {
			return err
		}
	}
	if *scheduled > 0 {
		fmt.Printf("bench: filling the table with %d queued jobs due in a day, over %d queue(s)\n", *scheduled, *queues)
		if err := relaySys.FillScheduled(ctx, pool, *scheduled); err != nil {
			return err
		}
	}
	if *backlog > 0 {
		fmt.Printf("bench: one ordering key with a running head and %d jobs queued behind it\n", *backlog)
		if err := relaySys.FillKeyBacklog(ctx, pool, *backlog); err != nil {
			return err
		}
	}
	if keep {
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+sys.Table()); err != nil {
			return err
		}
	}
	if *schedules > 0 {
		stop, err := startBenchSchedules(ctx, pool, *schedules)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer stop()
		fmt.Printf("bench: a scheduler with %d schedules, each firing every minute\n", *schedules)
	}
	if *holdXmin > 0 && *window == 0 {
		*window = 10 * time.Second
	}
	if *sampleWaits > 0 && *window == 0 {
		*window = 10 * time.Second
	}
	if (*holdXmin > 0 || *window > 0 || *sampleWaits > 0) && *rate == 0 {
		return errors.New("bench: --hold-xmin, --window and --sample-waits need --rate (steady mode)")
	}
	if *rate > 0 {
		fmt.Printf("bench: steady %d jobs/s for %s, %d process(es) × %d workers\n", *rate, *duration, *processes, *workers)
		steady := bench.Steady{Rate: *rate, Duration: *duration, Workers: *workers, Prefetch: *prefetch, Processes: *processes, Job: job, ClaimCoalesce: *coalesce, KeepTable: keep, Window: *window, NoClaimFloor: *noFloor, SynchronousClaims: *syncClaims, Queues: *queues}
		var held heldXmin
		if *window > 0 {
			steady.During = func(ctx context.Context, began time.Time) {
				if *sampleWaits > 0 {
					sctx, cancel := context.WithDeadline(ctx, began.Add(*duration))
					defer cancel()
					done := make(chan struct{})
					go func() { defer close(done); bench.SampleWaits(sctx, pool, began, *sampleWaits, *window, os.Stdout) }()
					defer func() { <-done }()
				}
				held = watchVacuum(ctx, pool, began, *duration, *window, *holdAt, *holdXmin)
			}
		}
		res, err = bench.RunSteady(ctx, env, sys, steady)
		if err == nil && *window > 0 {
			printWindows(res.Windows, held)
		}
	} else {
		var dueAt time.Time
		if *dueIn > 0 {
			dueAt = time.Now().Add(*dueIn).Truncate(time.Second).Add(time.Second)
			relaySys.DueAt = dueAt
			sys = relaySys
			fmt.Printf("bench: the jobs all become due at %s\n", dueAt.Format(time.RFC3339))
		}
		fmt.Printf("bench: burn-down of %d jobs, %d process(es) × %d workers\n", *jobs, *processes, *workers)
		res, err = bench.RunBurnDown(ctx, env, sys, bench.BurnDown{Jobs: *jobs, Workers: *workers, Prefetch: *prefetch, Processes: *processes, Job: job, KeepTable: keep, Queues: *queues, DueAt: dueAt})
	}
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if *keys > 0 {
		c, err := relaySys.OrderViolations(ctx, pool, res.KeyedStarts)
		if err != nil {
			return fmt.Errorf("bench: order check: %w", err)
		}
		dist := "Zipf"
		if *cycleKeys {
			dist = "in turn"
		}
		against := "the start of the previous job's outcome transaction (track_commit_timestamp off: a handler started during that transaction is not counted)"
		if c.CommitTimes {
			against = "the commit of the previous job's outcome (track_commit_timestamp)"
		}
		fmt.Printf("bench: ordering keys %d (%s): %d jobs started before their key's previous job finished, on %d keys; %d jobs without a reported start; handler starts compared with %s; %d claims' now() before the previous job's completion's now() (transaction starts, not an order)\n",
			*keys, dist, c.Jobs, c.Keys, c.Unreported, against, c.ClaimedEarly)
		if c.Unreported > 0 {
			return fmt.Errorf("bench: order check: %d succeeded jobs with a key but no handler start reported", c.Unreported)
		}
	}
	fmt.Println(res.Line())
	return nil
}

// runBenchWorkflow is `relay bench --workflow`: Relay's side of the
// workflow workloads of bench/compare, alone, in this process: runs queued
// up front and drained, then callers that each start a run and wait for its
// result. Each measurement prints its summary line. system "floor" is
// bench.WorkflowFloor, which has the queued drain of the chain only.
func runBenchWorkflow(ctx context.Context, dbURL, system string, runs, workers int, shapeName, callers string, duration time.Duration, eager, hops bool) error {
	shape, err := bench.ParseShape(shapeName)
	if err != nil {
		return err
	}
	var sys bench.WorkflowSystem = bench.RelayWorkflow{}
	switch system {
	case "relay":
	case "floor":
		if shape != bench.ShapeChain || eager || runs == 0 {
			return errors.New("bench: --workflow --system floor measures the chain's queued drain only: give --runs, no --shape or --eager")
		}
		sys, callers = bench.WorkflowFloor{}, ""
	default:
		return fmt.Errorf("bench: --system %q: want relay or floor", system)
	}
	var counts []int
	for _, c := range strings.Split(callers, ",") {
		if c = strings.TrimSpace(c); c == "" {
			continue
		}
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			return fmt.Errorf("bench: --callers: %q is not a positive count", c)
		}
		counts = append(counts, n)
	}
	if runs < 0 || workers < 1 {
		return errors.New("bench: --runs must be ≥ 0 and --workers ≥ 1")
	}
	if dbURL != "" {
		check, err := openPool(ctx, dbURL, false) // refused as relay migrate refuses it, in one line
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		check.Close()
	}
	if dbURL == "" {
		fmt.Println("bench: starting a throwaway PostgreSQL cluster (default settings, fsync on)")
		cluster, err := devpg.Start(ctx, devpg.Options{})
		if err != nil {
			return err
		}
		defer cluster.Stop() //nolint:errcheck
		dbURL = cluster.URL
	}
	pool, err := bench.NewPool(ctx, dbURL)
	if err != nil {
		return err
	}
	fmt.Printf("bench: %s\n", bench.Machine(ctx, pool))
	pool.Close()
	schema := fmt.Sprintf("relay_bench_wf_%08x", rand.Uint32())
	var specs []bench.WorkflowSpec
	if runs > 0 {
		specs = append(specs, bench.WorkflowSpec{Mode: "queued", Shape: shape, Runs: runs, Workers: workers})
	}
	for _, n := range counts {
		specs = append(specs, bench.WorkflowSpec{Mode: "latency", Shape: shape, Callers: n, Duration: duration, Warmup: 2 * time.Second, Workers: max(workers, n), Hops: hops})
	}
	for _, spec := range specs {
		spec.URL, spec.Schema = dbURL, schema
		systems := []bench.WorkflowSystem{sys}
		if eager && spec.Mode == "latency" {
			systems = append(systems, bench.RelayWorkflow{Eager: true})
		}
		for _, sys := range systems {
			fmt.Printf("bench: %s workflow %s, %s shape: %s\n", sys.Name(), spec.Mode, spec.Shape, sys.Describe(spec))
			res, err := bench.RunWorkflow(ctx, sys, spec)
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			fmt.Println(res.Line())
			fmt.Print(res.HopsTable())
		}
	}
	return nil
}

// heldXmin is when a --hold-xmin holder held the horizon (zero: never).
type heldXmin struct{ from, to time.Time }

// watchVacuum runs the --hold-xmin holder, if any, and prints, every
// window: PostgreSQL's CPU over the window, the claim index's size, the
// buffers a walk from its front to the first queued job touches (what a
// claim without the claim floor reads), and the table's dead rows as the
// statistics know them. It returns when the offered load ends.
func watchVacuum(ctx context.Context, pool *pgxpool.Pool, began time.Time, duration, window, at, hold time.Duration) heldXmin {
	var held heldXmin
	done := make(chan struct{})
	if hold > 0 {
		go func() {
			defer close(done)
			from, to, err := bench.HoldXmin(ctx, pool, "relay_jobs", began, at, hold, os.Stdout)
			if err != nil {
				fmt.Printf("  holder: %v\n", err)
			}
			held = heldXmin{from, to}
		}()
	} else {
		close(done)
	}
	lastCPU, _ := bench.PostgresCPU(ctx, pool)
	lastWAL, _ := readWAL(ctx, pool)
	for t := window; t <= duration; t += window {
		if sleepUntil(ctx, began.Add(t)) != nil {
			break
		}
		cpu, _ := bench.PostgresCPU(ctx, pool)
		pgShare := float64(cpu-lastCPU) / float64(window)
		lastCPU = cpu
		var idxBytes, dead, autovacuums int64
		var plan []byte
		err := pool.QueryRow(ctx, `
			SELECT pg_relation_size('relay_jobs_claim_idx'), n_dead_tup, autovacuum_count
			FROM pg_stat_user_tables WHERE relid = 'relay_jobs'::regclass`).Scan(&idxBytes, &dead, &autovacuums)
		if err == nil {
			err = pool.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON)
				SELECT id FROM relay_jobs WHERE state = 'queued' AND queue = 'default'
				ORDER BY priority, run_at, id LIMIT 1`).Scan(&plan)
		}
		var front []struct {
			Plan struct {
				Hit  int64 `json:"Shared Hit Blocks"`
				Read int64 `json:"Shared Read Blocks"`
			} `json:"Plan"`
		}
		if err == nil {
			err = json.Unmarshal(plan, &front)
		}
		if err != nil || len(front) != 1 {
			fmt.Printf("  +%s: stats: %v\n", t, err)
			continue
		}
		wal, err := readWAL(ctx, pool)
		d := wal.minus(lastWAL)
		lastWAL = wal
		if err != nil {
			d = walStats{}
		}
		fmt.Printf("  +%s: PostgreSQL CPU %.2f cores; claim index %d pages, a walk from its front %d buffers; relay_jobs dead rows %d, autovacuums %d; WAL %.1f MB (%d full-page images), %d checkpoints\n",
			t, pgShare, idxBytes/8192, front[0].Plan.Hit+front[0].Plan.Read, dead, autovacuums, float64(d.bytes)/1e6, d.fpi, d.checkpoints)
	}
	<-done
	return held
}

// walStats is what the server wrote to its WAL so far (pg_stat_wal) and
// the checkpoints it began (pg_stat_bgwriter), cluster-wide.
type walStats struct{ bytes, fpi, checkpoints int64 }

func (a walStats) minus(b walStats) walStats {
	return walStats{a.bytes - b.bytes, a.fpi - b.fpi, a.checkpoints - b.checkpoints}
}

func readWAL(ctx context.Context, pool *pgxpool.Pool) (walStats, error) {
	var w walStats
	err := pool.QueryRow(ctx, `SELECT w.wal_bytes::bigint, w.wal_fpi, b.checkpoints_timed + b.checkpoints_req
		FROM pg_stat_wal AS w, pg_stat_bgwriter AS b`).Scan(&w.bytes, &w.fpi, &w.checkpoints)
	return w, err
}

// printWindows prints the pickup latency of each window, labelled by the
// holder's phase, and a summary per phase: the worst window's p99 before,
// during and after the hold, and how long after the release the p99 came
// back under the worst of before.
func printWindows(ws []bench.Window, held heldXmin) {
	if len(ws) == 0 {
		return
	}
	origin := ws[0].Start
	type phase struct {
		name  string
		worst time.Duration
		n     int
	}
	phases := map[string]*phase{}
	order := []string{"before", "hold", "after"}
	for _, p := range order {
		phases[p] = &phase{name: p}
	}
	for _, w := range ws {
		end := w.Start.Add(10 * time.Second)
		if len(ws) > 1 {
			end = w.Start.Add(ws[1].Start.Sub(ws[0].Start))
		}
		name := "before"
		switch {
		case held.from.IsZero() || end.Before(held.from) || end.Equal(held.from):
		case held.to.IsZero() || w.Start.Before(held.to):
			name = "hold"
		default:
			name = "after"
		}
		p := phases[name]
		p.n++
		p.worst = max(p.worst, w.P99)
		fmt.Printf("bench: window +%-5s %-6s jobs=%-6d p50_ms=%.2f p99_ms=%.2f max_ms=%.1f\n",
			w.Start.Sub(origin).Round(time.Second), name, w.Jobs, ms(w.P50), ms(w.P99), ms(w.Max))
	}
	for _, name := range order {
		if p := phases[name]; p.n > 0 {
			fmt.Printf("bench: windows %s: %d, worst p99_ms=%.2f\n", name, p.n, ms(p.worst))
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
