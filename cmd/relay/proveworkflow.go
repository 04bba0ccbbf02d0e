package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/testkit/netfault"
	"github.com/relayq/relay/workflow"
)

//go:embed proveworkflow.sql
var proveWorkflowSQL string

// proveWFConfig is `relay prove workflow`'s flags.
type proveWFConfig struct {
	url          string
	runs         int
	processes    int
	concurrency  int
	kills        int
	pauses       int
	lease        time.Duration
	sleep        time.Duration
	failEvery    int
	earlyEvery   int
	updateEvery  int
	pgRestart    bool
	pgCrash      bool
	backendKill  int
	backendKillD time.Duration
	partitions   int
	partitionFor time.Duration
	lockStorm    bool
	cancelEvery  int
	retryFailed  bool
	stallBound   time.Duration
	failover     bool
	replication  string
	lag          time.Duration
	timeout      time.Duration
	keep         bool
	pgbouncer    bool
}

// outageEvery: with --retry-failed, one run in this many books its payment
// through the ledger, which is down until the faults are over: those runs
// end failed, and are retried.
const outageEvery = 10

// proveRunTimeout is each payment run's StartOpts.ExecutionTimeout.
const proveRunTimeout = 6 * time.Hour

// cohort is what run seq is asked to do: fail in report (compensated), go
// through the ledger outage (failed, then retried), or be cancelled.
func (c proveWFConfig) cohort(seq int) (fail, outage, cancel bool) {
	fail = c.failEvery > 0 && seq%c.failEvery == c.failEvery-1
	outage = !fail && c.retryFailed && seq%outageEvery == 3
	cancel = !fail && !outage && c.cancelEvery > 0 && seq%c.cancelEvery == c.cancelEvery/2
	return fail, outage, cancel
}

// updated: run seq takes an address update before its approval (never a
// run that fails, goes through the outage or is cancelled: those do not
// all reach it).
func (c proveWFConfig) updated(seq int) bool {
	fail, outage, cancel := c.cohort(seq)
	return c.updateEvery > 0 && seq%c.updateEvery == 1%c.updateEvery && !fail && !outage && !cancel
}

// runProveWorkflow is `relay prove workflow`: payment runs (charge →
// email ∥ report as children on another queue → notify: a sleep, then a
// signal the prover answers) executed by worker processes that are
// SIGKILLed, SIGSTOPped and cut off from PostgreSQL, while PostgreSQL is
// restarted or crashed, their backends are terminated and their run jobs'
// rows locked; one run in --fail-every fails in report and must be
// compensated; with --cancel-every the prover cancels runs at points spread
// over their path, and with --retry-failed runs that fail (the ledger
// outage, or a fault) are retried once the faults are over. The audit
// (proveworkflow.sql) checks every run's outcome and effects. The prover
// outlasts the faults it injects: its statements are retried.
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
	fs.IntVar(&c.updateEvery, "update-every", 3, "one run in this many takes an address update (workflow.HandleUpdate) before its approval, sent with it (0: none)")
	fs.BoolVar(&c.pgRestart, "pg-restart", false, "restart PostgreSQL mid-run (throwaway cluster only)")
	fs.BoolVar(&c.pgCrash, "pg-crash", false, "crash PostgreSQL mid-run (immediate shutdown, recovery from WAL; throwaway cluster only)")
	fs.IntVar(&c.backendKill, "backend-kill", 0, "terminate this many worker backends per second (pg_terminate_backend)")
	fs.DurationVar(&c.backendKillD, "backend-kill-for", 3*time.Second, "how long --backend-kill goes on")
	fs.IntVar(&c.partitions, "partition", 0, "cut a worker process executing a run off from PostgreSQL (through a TCP proxy of the prover) this many times, each for --partition-for, then restore it")
	fs.DurationVar(&c.partitionFor, "partition-for", 0, "how long each --partition lasts (default 2.5 × --lease)")
	fs.BoolVar(&c.lockStorm, "lock-storm", false, "from a side connection, lock a random running run job's row for 2 × --lease, again and again, until the other faults are over (a caller's long transaction)")
	fs.IntVar(&c.cancelEvery, "cancel-every", 0, "cancel one run in this many, at a point of its path (started, charged, children done, waiting for its signal, notified) (0: none)")
	fs.BoolVar(&c.retryFailed, "retry-failed", false, "one run in 10 fails while its ledger is down; once the faults are over the ledger is back and every failed run is retried (up to 3 times)")
	fs.DurationVar(&c.stallBound, "stall-bound", 90*time.Second, "runs not finished this long after the last fault count as stalled")
	fs.BoolVar(&c.failover, "failover", false, "run on a primary and a streaming standby (throwaway clusters, one multi-host URL), and mid-run stop the primary (-m immediate) and promote the standby")
	fs.StringVar(&c.replication, "replication", "sync", "with --failover: the standby's replication, sync or async")
	fs.DurationVar(&c.lag, "replication-lag", 0, "with --failover: cut the standby's link to the primary this long before the primary is stopped (a standby behind)")
	fs.DurationVar(&c.timeout, "timeout", 15*time.Minute, "give up after this long")
	fs.BoolVar(&c.keep, "keep", false, "keep the proof's schema afterwards")
	fs.BoolVar(&c.pgbouncer, "pgbouncer", false, "run the workers through a PgBouncer in transaction pooling that the prover starts in front of the server (default_query_exec_mode=exec; each worker's LISTEN goes direct)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if c.runs < 1 || c.processes < 1 || c.concurrency < 1 || c.kills < 0 || c.pauses < 0 || c.lease < 200*time.Millisecond || c.failEvery < 0 || c.earlyEvery < 0 || c.updateEvery < 0 ||
		c.backendKill < 0 || c.partitions < 0 || c.cancelEvery < 0 {
		return errors.New("prove workflow: --runs, --processes, --concurrency must be ≥ 1, --kill/--pause/--fail-every/--update-every/--backend-kill/--partition/--cancel-every ≥ 0, --lease ≥ 200ms")
	}
	if c.partitionFor == 0 {
		c.partitionFor = c.lease * 5 / 2
	}
	if c.partitionFor <= c.lease {
		return errors.New("prove workflow: --partition-for must be longer than --lease (a shorter cut tests nothing)")
	}
	if c.pgbouncer && (c.partitions > 0 || c.failover) {
		return errors.New("prove workflow: --partition and --failover work on direct connections; they do not combine with --pgbouncer")
	}
	if c.url != "" && (c.pgRestart || c.pgCrash) {
		return errors.New("prove workflow: --pg-restart and --pg-crash need the throwaway cluster (omit --database-url)")
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
	if _, err := pool.Exec(ctx, `INSERT INTO prove_wf_ledger (down) VALUES ($1)`, c.retryFailed); err != nil {
		return fmt.Errorf("prove workflow: create proof tables: %w", err)
	}

	// The sink: an outside service in this (never killed) process that
	// records every call with its idempotency token (through a database
	// restart: a call it could not record is refused, and retried).
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
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second) // the caller gives up after 10
		defer cancel()
		if err := retryDB(ctx, "sink: record call", func(ctx context.Context) error {
			_, err := pool.Exec(ctx, `INSERT INTO prove_wf_sink (run_id, kind, token) VALUES ($1, $2, $3)`, run, kind, token)
			return err
		}); err != nil {
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
	early, outages, cancels := 0, 0, 0
	for i := 0; i < c.runs; {
		n := min(500, c.runs-i)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for j := i; j < i+n; j++ {
				fail, outage, cancel := c.cohort(j)
				in := payIn{Seq: j, Fail: fail, Outage: outage, Update: c.updated(j), SleepMs: int(c.sleep.Milliseconds())}
				if _, err := workflow.Start(ctx, tx, wfs.payment, in, &workflow.StartOpts{ID: proveRunID(j), Queue: proveQueue, MaxAttempts: 1000,
					// An execution timeout far past the proof's length:
					// every suspension is cut to it, and no run reaches it.
					ExecutionTimeout: proveRunTimeout}); err != nil {
					return err
				}
				if cancel {
					// Where on its path the prover cancels it, in turn.
					stage := cancelStages()[cancels%len(cancelStages())]
					if _, err := tx.Exec(ctx, `INSERT INTO prove_wf_cancel_targets (run_id, stage) VALUES ($1, $2)`, proveRunID(j), stage); err != nil {
						return err
					}
					cancels++
				}
				if outage {
					outages++
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
			if _, outage, _ := c.cohort(j); c.earlyEvery > 0 && j%c.earlyEvery == 0 && !outage {
				if err := proveSignal(ctx, pool, proveRunID(j), true, c.updated(j)); err != nil {
					return err
				}
				early++
			}
		}
		i += n
	}
	fmt.Printf("prove: %d payment runs (%d to fail in report, %d through the ledger outage, %d to cancel, %d signalled early), %d processes × %d per queue, lease %s, sleep %s, kills %d, pauses %d\n",
		c.runs, failing(c), outages, cancels, early, c.processes, c.concurrency, c.lease, c.sleep, c.kills, c.pauses)

	// This run's worker connections carry its schema's name, so that
	// --backend-kill terminates no other run's.
	u, err := url.Parse(schemaURL)
	if err != nil {
		return fmt.Errorf("prove workflow: %w", err)
	}
	appName := "relay-prove-worker " + u.Query().Get("search_path")
	// With --partition, each worker slot reaches PostgreSQL through a proxy
	// of its own, which the prover can cut.
	var proxies []*netfault.Proxy
	if c.partitions > 0 {
		for i := 0; i < c.processes; i++ {
			p, err := netfault.Listen(u.Host)
			if err != nil {
				return fmt.Errorf("prove workflow: %w", err)
			}
			defer p.Close()
			proxies = append(proxies, p)
		}
	}

	workerURL, listenURL := schemaURL, ""
	if c.pgbouncer {
		b, err := startProofBouncer(ctx, schemaURL, u.Query().Get("search_path"), 2*c.processes*c.concurrency)
		if err != nil {
			return err
		}
		defer b.Stop() //nolint:errcheck
		workerURL, listenURL = proofBouncerURL(b), schemaURL
		fmt.Printf("prove: workers through PgBouncer (pool_mode=transaction, default_query_exec_mode=exec) on 127.0.0.1:%d; their LISTEN direct\n", b.Port)
	}
	start := time.Now()
	fleet := &workerFleet{lease: c.lease, argv: func(id string) []string {
		return []string{"prove-workflow-worker", "--database-url", workerURL, "--listener-url", listenURL, "--id", id, "--sink", sinkURL,
			"--concurrency", strconv.Itoa(c.concurrency), "--lease", c.lease.String(), "--app-name", appName}
	}}
	if proxies != nil {
		fleet.slotArgs = func(slot int) []string {
			pu := *u
			pu.Host = proxies[slot].Addr()
			return []string{"--database-url", pu.String()} // the later flag wins
		}
	}
	defer fleet.stopAll()
	for i := 0; i < c.processes; i++ {
		if err := fleet.start(i); err != nil {
			return err
		}
	}
	sup := &wfSupervisor{pool: pool, fleet: fleet, db: db, clock: &failoverClock{}, proxies: proxies, appName: appName, c: c}
	if err := sup.run(ctx); err != nil {
		return err
	}
	fleet.stopAll()
	elapsed := time.Since(start)
	if c.failover {
		if err := calls.store(ctx, pool); err != nil {
			return err
		}
	}

	if err := collectUpdateAnswers(ctx, pool); err != nil {
		return err
	}
	res := map[string]int64{}
	for _, name := range []string{"runs", "completed", "compensated", "cancelled", "failed", "lost", "stalled", "duplicate_tx_effects", "forked_runs",
		"late_checkpoints_refused", "order_violations", "sends_with_two_tokens", "sink_calls", "executions", "early_signals",
		"cancels", "cancels_accepted", "cancel_stages_accepted", "cancel_violations", "retried", "retry_violations", "updates"} {
		var n int64
		if err := retryDB(ctx, "workflow audit "+name, func(ctx context.Context) error {
			return pool.QueryRow(ctx, queries[name]).Scan(&n)
		}); err != nil {
			return err
		}
		res[name] = n
	}
	var violations []updateViolation
	if err := retryDB(ctx, "workflow audit update_violations", func(ctx context.Context) (err error) {
		violations, err = updateViolations(ctx, pool, queries)
		return err
	}); err != nil {
		return err
	}
	res["update_violations"] = int64(len(violations))
	for _, v := range violations {
		fmt.Printf("prove: update violation: run %s %s\n", v.run, v.counts)
	}
	if res["stalled"] > 0 {
		describeStalled(ctx, pool)
	}
	n := &sup.counts
	fmt.Printf("prove: %d executions; %d sink calls (%d sends reached the sink with two tokens); %d signals sent before their run waited; %d cancels accepted at %d of the %d points\n",
		res["executions"], res["sink_calls"], res["sends_with_two_tokens"], res["early_signals"], res["cancels_accepted"], res["cancel_stages_accepted"], len(cancelStages()))
	failoverFields := ""
	if c.failover {
		failoverFields = fmt.Sprintf(" replication=%s sends_with_two_tokens=%d %s", c.replication, res["sends_with_two_tokens"], sup.clock.summary())
	}
	fmt.Printf("proof: workflow runs=%d completed=%d compensated=%d cancelled=%d failed=%d lost=%d stalled=%d duplicate_tx_effects=%d forked_runs=%d late_checkpoints_refused=%d order_violations=%d cancels=%d cancels_accepted=%d cancel_violations=%d retried=%d retry_violations=%d updates=%d update_violations=%d kills=%d pauses=%d pg_restarts=%d pg_crashes=%d backend_kills=%d partitions=%d locks=%d%s elapsed=%s\n",
		res["runs"], res["completed"], res["compensated"], res["cancelled"], res["failed"], res["lost"], res["stalled"], res["duplicate_tx_effects"], res["forked_runs"],
		res["late_checkpoints_refused"], res["order_violations"], res["cancels"], res["cancels_accepted"], res["cancel_violations"], res["retried"], res["retry_violations"],
		res["updates"], res["update_violations"], n.kills, n.pauses, n.pgRestarts, n.pgCrashes, n.backendKills.Load(), n.partitions, n.locks.Load(), failoverFields, elapsed.Round(time.Millisecond))
	// Asynchronous replication can lose an outside call's stored token (the
	// call is made again with a new one): reported, not a failure.
	twoTokens := res["sends_with_two_tokens"]
	if c.failover && c.replication == "async" {
		twoTokens = 0
	}
	if res["runs"] != int64(c.runs) || res["lost"] != 0 || res["stalled"] != 0 || res["duplicate_tx_effects"] != 0 || res["forked_runs"] != 0 ||
		res["order_violations"] != 0 || twoTokens != 0 || res["cancel_violations"] != 0 || res["retry_violations"] != 0 ||
		res["update_violations"] != 0 {
		return errors.New("prove workflow: the audit failed")
	}
	return sup.exercised(res)
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
// keeps the prover from sending two) in one transaction with its record
// and, when update, with the run's address update and its record; a run
// already finished (cancelled) is recorded as answered.
func proveSignal(ctx context.Context, pool *pgxpool.Pool, run string, early, update bool) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO prove_wf_signals (run_id, early) VALUES ($1, $2) ON CONFLICT DO NOTHING`, run, early)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		if update {
			addr := "street " + run
			uid, err := workflow.SendUpdate(ctx, tx, run, proveUpdateName, addr)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO prove_wf_updates (run_id, update_id, address) VALUES ($1, $2, $3)`, run, uid, addr); err != nil {
				return err
			}
		}
		return workflow.Signal(ctx, tx, run, proveSignalName, "approved")
	})
	if errors.Is(err, workflow.ErrRunFinished) {
		// Cancelled meanwhile (--cancel-every): nothing to approve.
		_, err = pool.Exec(ctx, `INSERT INTO prove_wf_signals (run_id, early) VALUES ($1, $2) ON CONFLICT DO NOTHING`, run, early)
	}
	if err != nil {
		return fmt.Errorf("prove workflow: signal %s: %w", run, err)
	}
	return nil
}

// collectUpdateAnswers records the answer to each update the prover sent
// (every run is final by now: UpdateResult returns at once), or the error
// it got instead.
func collectUpdateAnswers(ctx context.Context, pool *pgxpool.Pool) error {
	rows, err := pool.Query(ctx, `SELECT update_id FROM prove_wf_updates ORDER BY update_id`)
	if err != nil {
		return fmt.Errorf("prove workflow: read the updates sent: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("prove workflow: read the updates sent: %w", err)
	}
	for _, uid := range ids {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		answer, uerr := workflow.UpdateResult[string](wctx, pool, nil, uid) // final: one read, no listener
		cancel()
		var answerCol, errCol any
		if uerr != nil {
			errCol = uerr.Error()
		} else {
			answerCol = answer
		}
		if err := retryDB(ctx, "record update answer", func(ctx context.Context) error {
			_, err := pool.Exec(ctx, `UPDATE prove_wf_updates SET answer = $2, error = $3 WHERE update_id = $1`, uid, answerCol, errCol)
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// updateViolation is a payment run the update_violations audit counts,
// with the counts that made it one.
type updateViolation struct {
	run, counts string
}

// updateViolations runs the update_violations audit (proveworkflow.sql)
// through db.
func updateViolations(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, queries map[string]string) ([]updateViolation, error) {
	rows, err := db.Query(ctx, queries["update_violations"])
	if err != nil {
		return nil, fmt.Errorf("prove workflow: audit updates: %w", err)
	}
	vs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (v updateViolation, err error) {
		err = r.Scan(&v.run, &v.counts)
		return v, err
	})
	if err != nil {
		return nil, fmt.Errorf("prove workflow: audit updates: %w", err)
	}
	return vs, nil
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
