package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/workflow"
)

//go:embed proveworkflow.sql
var proveWorkflowSQL string

// proveWFConfig is `relay prove workflow`'s flags.
type proveWFConfig struct {
	url         string
	runs        int
	processes   int
	concurrency int
	kills       int
	pauses      int
	lease       time.Duration
	sleep       time.Duration
	failEvery   int
	earlyEvery  int
	stallBound  time.Duration
	failover    bool
	replication string
	lag         time.Duration
	timeout     time.Duration
	keep        bool
}

// runProveWorkflow is `relay prove workflow`: payment runs (charge →
// email ∥ report as children on another queue → notify: a sleep, then a
// signal the prover answers) executed by worker processes that are
// SIGKILLed and SIGSTOPped; one run in --fail-every fails in report and
// must be compensated. The audit (proveworkflow.sql) checks every run's
// outcome and effects.
func runProveWorkflow(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prove workflow", flag.ContinueOnError)
	var c proveWFConfig
	fs.StringVar(&c.url, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL; the proof runs in a fresh schema of its own (default: a throwaway cluster)")
	fs.IntVar(&c.runs, "runs", 500, "payment runs to start")
	fs.IntVar(&c.processes, "processes", 3, "worker OS processes")
	fs.IntVar(&c.concurrency, "concurrency", 8, "executions at once per process and queue")
	fs.IntVar(&c.kills, "kill", 0, "SIGKILL a random worker process this many times, restarting it")
	fs.IntVar(&c.pauses, "pause", 0, "SIGSTOP a worker executing a run until another worker has taken the run over, then SIGCONT it, this many times")
	fs.DurationVar(&c.lease, "lease", 2*time.Second, "lease of a run's execution")
	fs.DurationVar(&c.sleep, "sleep", 300*time.Millisecond, "the durable sleep before notify")
	fs.IntVar(&c.failEvery, "fail-every", 10, "one run in this many fails in report and is compensated (0: none)")
	fs.IntVar(&c.earlyEvery, "early-signal-every", 4, "one run in this many gets its signal before it waits (0: none)")
	fs.DurationVar(&c.stallBound, "stall-bound", 90*time.Second, "runs not finished this long after the last fault count as stalled")
	fs.BoolVar(&c.failover, "failover", false, "run on a primary and a streaming standby (throwaway clusters, one multi-host URL), and mid-run stop the primary (-m immediate) and promote the standby")
	fs.StringVar(&c.replication, "replication", "sync", "with --failover: the standby's replication, sync or async")
	fs.DurationVar(&c.lag, "replication-lag", 0, "with --failover: cut the standby's link to the primary this long before the primary is stopped (a standby behind)")
	fs.DurationVar(&c.timeout, "timeout", 15*time.Minute, "give up after this long")
	fs.BoolVar(&c.keep, "keep", false, "keep the proof's schema afterwards")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if c.runs < 1 || c.processes < 1 || c.concurrency < 1 || c.kills < 0 || c.pauses < 0 || c.lease < 200*time.Millisecond || c.failEvery < 0 || c.earlyEvery < 0 {
		return errors.New("prove workflow: --runs, --processes, --concurrency must be ≥ 1, --kill/--pause/--fail-every ≥ 0, --lease ≥ 200ms")
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	replication := ""
	if c.failover {
		if c.url != "" {
			return errFailoverNeedsCluster
		}
		replication = c.replication
	}
	db, err := openProofDBWith(ctx, c.url, c.keep, replication)
	if err != nil {
		return fmt.Errorf("prove workflow: %w", err)
	}
	defer db.Close()
	pool, schemaURL := db.Pool, db.URL
	queries := proveWFQueries()
	if _, err := pool.Exec(ctx, queries["schema"]); err != nil {
		return fmt.Errorf("prove workflow: create proof tables: %w", err)
	}

	// The sink: an outside service in this (never killed) process that
	// records every call with its idempotency token.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	// With --failover the sink's record is kept in memory (a failover
	// with asynchronous replication could lose rows of it) and written to
	// its table for the audit.
	var calls sinkCalls
	sink := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		run, kind, token := r.URL.Query().Get("run"), r.URL.Query().Get("kind"), r.Header.Get("Idempotency-Key")
		if run == "" || kind == "" || token == "" {
			http.Error(w, "run, kind and Idempotency-Key required", http.StatusBadRequest)
			return
		}
		if c.failover {
			calls.add(run, kind, token)
			fmt.Fprint(w, "accepted")
			return
		}
		if _, err := pool.Exec(r.Context(), `INSERT INTO prove_wf_sink (run_id, kind, token) VALUES ($1, $2, $3)`, run, kind, token); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "accepted")
	})}
	go sink.Serve(ln) //nolint:errcheck
	defer sink.Close()
	sinkURL := "http://" + ln.Addr().String() + "/send"

	// The runs, started up front (the registry here only names the
	// workflow: this process executes nothing).
	reg := workflow.NewRegistry(pool, nil)
	wfs := registerProveWorkflows(reg, nil)
	early := 0
	for i := 0; i < c.runs; {
		n := min(500, c.runs-i)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for j := i; j < i+n; j++ {
				in := payIn{Seq: j, Fail: c.failEvery > 0 && j%c.failEvery == c.failEvery-1, SleepMs: int(c.sleep.Milliseconds())}
				if _, err := workflow.Start(ctx, tx, wfs.payment, in, &workflow.StartOpts{ID: proveRunID(j), Queue: proveQueue, MaxAttempts: 1000}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("prove workflow: start runs: %w", err)
		}
		// Some approvals are sent before their run waits: the mailbox
		// must keep them.
		for j := i; j < i+n; j++ {
			if c.earlyEvery > 0 && j%c.earlyEvery == 0 {
				if err := proveSignal(ctx, pool, proveRunID(j), true); err != nil {
					return err
				}
				early++
			}
		}
		i += n
	}
	fmt.Printf("prove: %d payment runs (%d to fail in report, %d signalled early), %d processes × %d per queue, lease %s, sleep %s, kills %d, pauses %d\n",
		c.runs, failing(c), early, c.processes, c.concurrency, c.lease, c.sleep, c.kills, c.pauses)

	start := time.Now()
	fleet := &workerFleet{lease: c.lease, argv: func(id string) []string {
		return []string{"prove-workflow-worker", "--database-url", schemaURL, "--id", id, "--sink", sinkURL,
			"--concurrency", strconv.Itoa(c.concurrency), "--lease", c.lease.String()}
	}}
	defer fleet.stopAll()
	for i := 0; i < c.processes; i++ {
		if err := fleet.start(i); err != nil {
			return err
		}
	}
	clock := &failoverClock{}
	kills, pauses, err := superviseWorkflowProof(ctx, pool, fleet, c, db, clock)
	if err != nil {
		return err
	}
	fleet.stopAll()
	elapsed := time.Since(start)
	if c.failover {
		if err := calls.store(ctx, pool); err != nil {
			return err
		}
	}

	res := map[string]int64{}
	for _, name := range []string{"runs", "completed", "compensated", "lost", "stalled", "duplicate_tx_effects", "forked_runs",
		"late_checkpoints_refused", "order_violations", "sends_with_two_tokens", "sink_calls", "executions", "early_signals"} {
		var n int64
		if err := retryDB(ctx, "workflow audit "+name, func(ctx context.Context) error { return pool.QueryRow(ctx, queries[name]).Scan(&n) }); err != nil {
			return err
		}
		res[name] = n
	}
	if res["stalled"] > 0 {
		describeStalled(ctx, pool)
	}
	fmt.Printf("prove: %d executions; %d sink calls (%d sends reached the sink with two tokens); %d signals sent before their run waited\n",
		res["executions"], res["sink_calls"], res["sends_with_two_tokens"], res["early_signals"])
	failoverFields := ""
	if c.failover {
		failoverFields = fmt.Sprintf(" replication=%s sends_with_two_tokens=%d %s", c.replication, res["sends_with_two_tokens"], clock.summary())
	}
	fmt.Printf("proof: workflow runs=%d completed=%d compensated=%d lost=%d stalled=%d duplicate_tx_effects=%d forked_runs=%d late_checkpoints_refused=%d order_violations=%d kills=%d pauses=%d%s elapsed=%s\n",
		res["runs"], res["completed"], res["compensated"], res["lost"], res["stalled"], res["duplicate_tx_effects"], res["forked_runs"],
		res["late_checkpoints_refused"], res["order_violations"], kills, pauses, failoverFields, elapsed.Round(time.Millisecond))
	// Asynchronous replication can lose an outside call's stored token (the
	// call is made again with a new one): reported, not a failure.
	twoTokens := res["sends_with_two_tokens"]
	if c.failover && c.replication == "async" {
		twoTokens = 0
	}
	if res["runs"] != int64(c.runs) || res["lost"] != 0 || res["stalled"] != 0 || res["duplicate_tx_effects"] != 0 || res["forked_runs"] != 0 ||
		res["order_violations"] != 0 || twoTokens != 0 {
		return errors.New("prove workflow: the audit failed")
	}
	return nil
}

func failing(c proveWFConfig) int {
	if c.failEvery == 0 {
		return 0
	}
	return c.runs / c.failEvery
}

// proveRunID is the id of payment run seq.
func proveRunID(seq int) string { return fmt.Sprintf("pay-%06d", seq) }

// proveSignal sends run's approval once (the proof table's primary key
// keeps the prover from sending two) in one transaction with its record.
func proveSignal(ctx context.Context, pool *pgxpool.Pool, run string, early bool) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO prove_wf_signals (run_id, early) VALUES ($1, $2) ON CONFLICT DO NOTHING`, run, early)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		return workflow.Signal(ctx, tx, run, proveSignalName, "approved")
	})
	if err != nil {
		return fmt.Errorf("prove workflow: signal %s: %w", run, err)
	}
	return nil
}

// proveWFQueries splits proveworkflow.sql into its named statements.
func proveWFQueries() map[string]string {
	out := map[string]string{}
	for _, block := range strings.Split(proveWorkflowSQL, "-- name: ")[1:] {
		name, query, _ := strings.Cut(block, "\n")
		out[strings.TrimSpace(name)] = query
	}
	return out
}

// superviseWorkflowProof answers the runs' approval requests, shows
// progress, fires the faults at evenly spaced points of the first 60% of
// the effects, and returns once every run is final, or stallBound after the
// last fault.
func superviseWorkflowProof(ctx context.Context, pool *pgxpool.Pool, fleet *workerFleet, c proveWFConfig, db *proofDB, clock *failoverClock) (kills, pauses int, err error) {
	var faults []string
	if c.failover {
		faults = append(faults, "failover")
	}
	for range c.kills {
		faults = append(faults, "kill")
	}
	for range c.pauses {
		faults = append(faults, "pause")
	}
	rand.Shuffle(len(faults), func(i, j int) { faults[i], faults[j] = faults[j], faults[i] })
	next := 0
	var pausing sync.WaitGroup
	faultsDone := time.Time{}
	if len(faults) == 0 {
		faultsDone = time.Now()
	}
	lastPrint := time.Time{}
	// dbErr gives up on a failed read or write of the loop, unless a
	// failover may be under way: then the loop tries again.
	dbErr := func(err error) error {
		if !c.failover || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
		return nil
	}
	for {
		// Answer the runs that asked for their approval.
		rows, err := pool.Query(ctx, `SELECT DISTINCT a.run_id FROM prove_wf_asks a
			WHERE NOT EXISTS (SELECT 1 FROM prove_wf_signals s WHERE s.run_id = a.run_id)`)
		if err != nil {
			if err := dbErr(err); err != nil {
				return kills, pauses, fmt.Errorf("prove workflow: %w", err)
			}
			continue
		}
		asks, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			if err := dbErr(err); err != nil {
				return kills, pauses, fmt.Errorf("prove workflow: %w", err)
			}
			continue
		}
		for _, run := range asks {
			if err := proveSignal(ctx, pool, run, false); err != nil {
				if err := dbErr(err); err != nil {
					return kills, pauses, err
				}
			}
		}
		var done int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_workflow_runs WHERE workflow = 'prove.payment'
			AND state IN ('completed', 'failed', 'compensated', 'cancelled')`).Scan(&done); err != nil {
			if err := dbErr(err); err != nil {
				return kills, pauses, fmt.Errorf("prove workflow: %w", err)
			}
			continue
		}
		clock.observe(done)
		if time.Since(lastPrint) > time.Second || done == c.runs {
			fmt.Printf("prove: done %d/%d  kills %d/%d  pauses %d/%d  restarts %d\n", done, c.runs, kills, c.kills, pauses, c.pauses, fleet.restarts())
			lastPrint = time.Now()
		}
		if next == len(faults) && faultsDone.IsZero() {
			pausing.Wait()
			faultsDone = time.Now()
		}
		if done == c.runs {
			if next < len(faults) {
				return kills, pauses, fmt.Errorf("prove workflow: the runs finished before %d of the %d faults fired; use more runs", len(faults)-next, len(faults))
			}
			pausing.Wait()
			return kills, pauses, nil
		}
		if !faultsDone.IsZero() && time.Since(faultsDone) > c.stallBound {
			fmt.Printf("prove: %d runs not final %s after the last fault\n", c.runs-done, c.stallBound)
			return kills, pauses, nil
		}
		// Faults fire by effects written (finished runs come in a rush at
		// the end of a run's path): fault i when they pass (i+1)/(faults+1)
		// of the first 60% of all the effects expected.
		var effects int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM prove_wf_effects`).Scan(&effects); err != nil {
			if err := dbErr(err); err != nil {
				return kills, pauses, fmt.Errorf("prove workflow: %w", err)
			}
			continue
		}
		expected := (c.runs-failing(c))*4 + failing(c)*3
		if next < len(faults) && effects >= (next+1)*expected*6/10/(len(faults)+1) {
			switch faults[next] {
			case "kill":
				if err := fleet.kill(func(id string) error { return recordKill(ctx, pool, id) }); err != nil {
					return kills, pauses, err
				}
				kills++
			case "failover":
				if err := failover(ctx, db, clock, c.lag); err != nil {
					return kills, pauses, err
				}
			case "pause":
				pauses++
				pausing.Add(1)
				go func() {
					defer pausing.Done()
					// A worker stopped inside a transaction holding its
					// run job's row keeps it from being taken over: try
					// another moment, a few times.
					for try := 0; try < 10; try++ {
						if fleet.pause(ctx, pool) {
							return
						}
					}
					fmt.Fprintln(os.Stderr, "prove workflow: a pause was not exercised (no run taken over while its worker was stopped)")
				}()
			}
			next++
		}
		select {
		case <-ctx.Done():
			return kills, pauses, fmt.Errorf("prove workflow: gave up: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// describeStalled prints what a few stalled runs (and their children)
// were waiting for: the run, its job, its steps.
func describeStalled(ctx context.Context, pool *pgxpool.Pool) {
	rows, err := pool.Query(ctx, `
		SELECT r.id, r.workflow, r.state, r.executions, coalesce(j.state, '?'), coalesce(j.run_at::text, ''), coalesce(j.attempt, 0),
		       coalesce(j.attempted_by, ''), coalesce(j.lease_expires_at::text, ''),
		       coalesce((SELECT string_agg(format('%s:%s:%s:%s wake=%s child=%s', s.position, s.key, s.kind, s.state, s.wake_at, s.child_id), '; ' ORDER BY s.position)
		                 FROM relay_workflow_steps s WHERE s.run_id = r.id), '')
		FROM relay_workflow_runs r LEFT JOIN relay_jobs j ON j.id = r.job_id
		WHERE r.state NOT IN ('completed', 'failed', 'compensated', 'cancelled')
		ORDER BY r.id LIMIT 10`)
	if err != nil {
		fmt.Println("prove: describe stalled runs:", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var id, wf, state, jstate, runAt, by, lease, steps string
		var execs, attempt int
		if err := rows.Scan(&id, &wf, &state, &execs, &jstate, &runAt, &attempt, &by, &lease, &steps); err != nil {
			fmt.Println("prove: describe stalled runs:", err)
			return
		}
		fmt.Printf("prove: stalled %s (%s) state=%s executions=%d job: state=%s run_at=%s attempt=%d by=%s lease_expires=%s\n  steps: %s\n",
			id, wf, state, execs, jstate, runAt, attempt, by, lease, steps)
	}
}
