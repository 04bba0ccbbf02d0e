package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/bench"
	"github.com/relayq/relay/core"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/devpg"
	"github.com/relayq/relay/testkit/netfault"
)

//go:embed prove.sql
var proveAudit string

//go:embed prove_schema.sql
var proveSchema string

type proveConfig struct {
	url          string
	jobs         int
	processes    int
	concurrency  int
	jobTime      time.Duration
	kills        int
	sigterms     int
	lease        time.Duration
	pgRestart    bool
	pgCrash      bool
	backendKill  int
	backendKillD time.Duration
	pauses       int
	partitions   int
	partitionFor time.Duration
	lockStorm    bool
	failover     bool
	replication  string
	lag          time.Duration
	workFirst    bool
	syncClaims   bool
	timeout      time.Duration
	keep         bool
	pgbouncer    bool
	spread       bool
}

// proveUsage lists the proofs; each one's flags come with
// `relay prove <proof> --help`.
const proveUsage = `Usage: relay prove <proof> [flags]

Proofs:
  queue        no job is lost or its effect duplicated under kill -9, SIGTERM
               and database faults
  scheduler    every fire time of a schedule gets exactly one job across
               processes under kill -9
  idempotency  each job's database effect happens once and its outside call
               keeps one token, under kill -9
  outbox       published events reach their subscribers once, in order per
               key, under kill -9
  workflow     workflow runs finish once, in order, compensated when they
               fail, cancelled when cancelled, retried without repeating a
               StepTx, with no forked run, under kill -9, SIGSTOP and
               database faults

relay prove <proof> --help lists the proof's flags.
`

// proveCounts are the faults a run actually made.
type proveCounts struct {
	kills, terms, pauses, partitions int
	backendKills, locks              atomic.Int64
}

func runProve(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "scheduler" {
		return runProveScheduler(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "idempotency" {
		return runProveIdempotency(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "outbox" {
		return runProveOutbox(ctx, args[1:])
	}
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help") {
		fmt.Print(proveUsage)
		return errHelp
	}
	if len(args) > 0 && args[0] == "workflow" {
		return runProveWorkflow(ctx, args[1:])
	}
	if len(args) == 0 || args[0] != "queue" {
		what := "name a proof"
		if len(args) > 0 {
			what = fmt.Sprintf("unknown proof %q", args[0])
		}
		fmt.Fprintf(os.Stderr, "relay prove: %s\n\n%s", what, proveUsage)
		return usageError{errors.New(what)}
	}
	fs := flag.NewFlagSet("prove queue", flag.ContinueOnError)
	var c proveConfig
	fs.StringVar(&c.url, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL; the proof runs in a fresh schema of its own (default: a throwaway cluster)")
	fs.IntVar(&c.jobs, "jobs", 1000, "jobs to enqueue")
	fs.IntVar(&c.processes, "processes", 3, "worker OS processes")
	fs.IntVar(&c.concurrency, "concurrency", 8, "jobs at once per process")
	fs.DurationVar(&c.jobTime, "job-time", 20*time.Millisecond, "handler duration (±50% jitter)")
	fs.IntVar(&c.kills, "kill", 0, "SIGKILL a random worker process this many times, restarting it")
	fs.IntVar(&c.sigterms, "sigterm", 0, "SIGTERM a random worker process this many times (it must drain), restarting it")
	fs.DurationVar(&c.lease, "lease", 2*time.Second, "lease duration")
	fs.BoolVar(&c.pgRestart, "pg-restart", false, "restart PostgreSQL mid-run (throwaway cluster only)")
	fs.BoolVar(&c.pgCrash, "pg-crash", false, "crash PostgreSQL mid-run (immediate shutdown, recovery from WAL; throwaway cluster only)")
	fs.IntVar(&c.backendKill, "backend-kill", 0, "terminate this many worker backends per second (pg_terminate_backend)")
	fs.DurationVar(&c.backendKillD, "backend-kill-for", 3*time.Second, "how long --backend-kill goes on")
	fs.IntVar(&c.pauses, "pause", 0, "SIGSTOP a worker holding a job until a rescue has ended its lease on that job, then SIGCONT it (late-worker case), this many times")
	fs.IntVar(&c.partitions, "partition", 0, "cut a worker process off from PostgreSQL (through a TCP proxy of the prover) this many times, each for --partition-for, then restore it")
	fs.DurationVar(&c.partitionFor, "partition-for", 0, "how long each --partition lasts (default 2.5 × --lease)")
	fs.BoolVar(&c.lockStorm, "lock-storm", false, "from a side connection, lock a random running job's row for 2 × --lease, again and again (a caller's long transaction)")
	fs.BoolVar(&c.failover, "failover", false, "run on a primary and a streaming standby (throwaway clusters, one multi-host URL), enqueue over the run, and mid-run stop the primary (-m immediate) and promote the standby")
	fs.StringVar(&c.replication, "replication", "sync", "with --failover: the standby's replication, sync or async")
	fs.DurationVar(&c.lag, "replication-lag", 0, "with --failover: stop the standby's WAL receiver this long before the primary is stopped (a standby behind, as over a slow link)")
	fs.BoolVar(&c.syncClaims, "synchronous-claims", false, "the workers' claims commit synchronously (core.Config.SynchronousClaims)")
	fs.BoolVar(&c.workFirst, "work-before-write", false, "handlers work (seen by the outside sink) before their first database write, as a handler calling an outside service first does")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "give up after this long")
	fs.BoolVar(&c.keep, "keep", false, "keep the proof's schema afterwards")
	fs.BoolVar(&c.pgbouncer, "pgbouncer", false, "run the workers through a PgBouncer in transaction pooling that the prover starts in front of the server (default_query_exec_mode=exec; each worker's LISTEN goes direct)")
	fs.BoolVar(&c.spread, "spread", false, "enqueue the jobs over the run, at 80% of the fleet's capacity, instead of all at once: the pickup latency printed then measures the pickup, not a backlog")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if c.jobs < 1 || c.processes < 1 || c.concurrency < 1 || c.kills < 0 || c.sigterms < 0 || c.pauses < 0 || c.partitions < 0 || c.lease < 200*time.Millisecond {
		return errors.New("prove: --jobs, --processes, --concurrency must be ≥ 1, --kill/--sigterm/--pause/--partition ≥ 0, --lease ≥ 200ms")
	}
	if c.partitionFor == 0 {
		c.partitionFor = c.lease * 5 / 2
	}
	if c.pgbouncer && (c.partitions > 0 || c.failover) {
		return errors.New("prove: --partition and --failover work on direct connections; they do not combine with --pgbouncer")
	}
	if c.partitionFor <= c.lease {
		return errors.New("prove: --partition-for must be longer than --lease (a shorter cut tests nothing)")
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	if c.url != "" && (c.pgRestart || c.pgCrash) {
		return errors.New("prove: --pg-restart and --pg-crash need the throwaway cluster (omit --database-url)")
	}
	replication := ""
	if c.failover {
		if c.url != "" {
			return errFailoverNeedsCluster
		}
		if c.pgRestart || c.pgCrash || c.partitions > 0 {
			return errors.New("prove: --failover does not combine with --pg-restart, --pg-crash or --partition")
		}
		replication = c.replication
	}
	db, err := openProofDBWith(ctx, c.url, c.keep, replication)
	if err != nil {
		return fmt.Errorf("prove: %w", err)
	}
	defer db.Close()
	pool, schemaURL := db.Pool, db.URL
	if _, err := pool.Exec(ctx, proveSchema); err != nil {
		return fmt.Errorf("prove: create proof tables: %w", err)
	}
	enqueued := make(chan error, 1)
	switch {
	case c.failover:
		enqueued <- nil // a producer enqueues through the failover, below
	case c.spread:
		go func() { enqueued <- enqueueSpread(ctx, pool, c) }()
	default:
		if err := enqueueProofJobs(ctx, pool, c); err != nil {
			return err
		}
		enqueued <- nil
	}
	fmt.Printf("prove: %d jobs, %d processes × %d, job time %s, lease %s, kills %d, sigterms %d\n",
		c.jobs, c.processes, c.concurrency, c.jobTime, c.lease, c.kills, c.sigterms)

	// This run's worker connections carry its schema's name, so that
	// --backend-kill terminates no other run's.
	u, err := url.Parse(schemaURL)
	if err != nil {
		return fmt.Errorf("prove: %w", err)
	}
	appName := "relay-prove-worker " + u.Query().Get("search_path")
	workerURL, listenURL, pooler := schemaURL, "", "direct"
	if c.pgbouncer {
		b, err := startProofBouncer(ctx, schemaURL, u.Query().Get("search_path"), c.processes*c.concurrency)
		if err != nil {
			return err
		}
		defer b.Stop() //nolint:errcheck
		workerURL, listenURL, pooler = proofBouncerURL(b), schemaURL, "pgbouncer-transaction"
		fmt.Printf("prove: workers through PgBouncer (pool_mode=transaction, default_query_exec_mode=exec) on 127.0.0.1:%d; their LISTEN direct\n", b.Port)
	}
	sink, err := startProofSink()
	if err != nil {
		return err
	}
	defer sink.Close()
	// With --partition, each worker slot reaches PostgreSQL through a proxy
	// of its own, which the prover can cut.
	var proxies []*netfault.Proxy
	if c.partitions > 0 {
		for i := 0; i < c.processes; i++ {
			p, err := netfault.Listen(u.Host)
			if err != nil {
				return fmt.Errorf("prove: %w", err)
			}
			defer p.Close()
			proxies = append(proxies, p)
		}
	}

	start := time.Now()
	fleet := &workerFleet{lease: c.lease, sink: sink, argv: func(id string) []string {
		return []string{"prove-worker", "--database-url", workerURL, "--listener-url", listenURL, "--id", id,
			"--concurrency", fmt.Sprint(c.concurrency), "--lease", c.lease.String(), "--sink", sink.URL(), "--app-name", appName,
			fmt.Sprint("--work-before-write=", c.workFirst), fmt.Sprint("--synchronous-claims=", c.syncClaims)}
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
	var counts proveCounts
	var producer *proofProducer
	if c.failover {
		producer = produceProofJobs(ctx, pool, c)
	}
	clock := &failoverClock{}
	stormCtx, stopStorm := context.WithCancel(ctx)
	var storm sync.WaitGroup
	if c.lockStorm {
		storm.Add(1)
		go func() { defer storm.Done(); lockStorm(stormCtx, pool, "prove.job", 2*c.lease, &counts.locks) }()
	}
	err = superviseProof(ctx, pool, fleet, db, proxies, appName, c, &counts, producer, clock)
	stopStorm()
	storm.Wait()
	if err != nil {
		return err
	}
	fleet.stopAll()
	elapsed := time.Since(start)
	if err := <-enqueued; err != nil {
		return fmt.Errorf("prove: enqueue: %w", err)
	}

	res, err := audit(ctx, pool)
	if err != nil {
		return err
	}
	p50, p99, err := proofPickup(ctx, pool)
	if err != nil {
		return err
	}
	external, windows := sink.overlaps()
	failoverFields := ""
	var lostEnqueues int64
	if c.failover {
		if lostEnqueues, err = producer.lostEnqueues(ctx, pool); err != nil {
			return err
		}
		producer.mu.Lock()
		failoverFields = fmt.Sprintf(" replication=%s lost_enqueues=%d enqueue_retries=%d %s", c.replication, lostEnqueues, producer.retries, clock.summary())
		producer.mu.Unlock()
	}
	fmt.Printf("proof: jobs=%d succeeded=%d dead=%d lost=%d duplicate_effects=%d overlapping_executions=%d external_overlaps=%d re_executions=%d fenced_attempts=%d kills=%d sigterms=%d pauses=%d partitions=%d locks=%d backend_kills=%d observed_attempts=%d%s pooler=%s pickup_p50_ms=%.1f pickup_p99_ms=%.1f elapsed=%s\n",
		res["jobs"], res["succeeded"], res["dead"], res["lost"], res["duplicate_effects"], res["overlapping_executions"], external, res["re_executions"],
		res["fenced_attempts"], counts.kills, counts.terms, counts.pauses, counts.partitions, counts.locks.Load(), counts.backendKills.Load(), windows,
		failoverFields, pooler, p50, p99, elapsed.Round(time.Millisecond))
	// Across a failover, attempts are promised not to overlap only with
	// synchronous replication and synchronous claims (a claim committed
	// asynchronously can be missing on the new primary, its job claimed
	// again while the first handler runs); across a crash of PostgreSQL,
	// only with synchronous claims (an unflushed claim is lost in the
	// recovery the same way, docs/failure-semantics.md). Otherwise
	// overlaps are reported, not a failure.
	overlapsPromised := (!c.failover || c.replication == "sync") && (c.syncClaims || !(c.failover || c.pgCrash))
	overlaps := res["overlapping_executions"] != 0 || external != 0
	if res["lost"] != 0 || res["duplicate_effects"] != 0 || (overlaps && overlapsPromised) {
		return errors.New("prove: the audit failed")
	}
	if overlaps && c.failover {
		fmt.Println("prove: attempts overlapped across the failover: a claim committed asynchronously was missing on the new primary (see docs/deploy.md)")
	} else if overlaps {
		fmt.Println("prove: attempts overlapped across the crash: a claim committed asynchronously was lost in the recovery (see docs/failure-semantics.md; --synchronous-claims closes it)")
	}
	// Asynchronous replication does not promise an acknowledged commit
	// survives a failover: its lost enqueues are reported, not a failure.
	if c.failover && c.replication == "sync" && lostEnqueues != 0 {
		return errors.New("prove: the audit failed: acknowledged enqueues lost with synchronous replication")
	}
	if counts.pauses < c.pauses {
		return fmt.Errorf("prove: --pause %d asked for, but only %d pauses saw their job taken over: the fault was not exercised", c.pauses, counts.pauses)
	}
	if c.backendKill > 0 && counts.backendKills.Load() == 0 {
		return errors.New("prove: --backend-kill terminated no worker connection: the fault was not exercised")
	}
	if c.lockStorm && counts.locks.Load() == 0 {
		return errors.New("prove: --lock-storm locked no running job: the fault was not exercised")
	}
	return nil
}

// proofDB is the database of a proof or a benchmark: a fresh schema,
// migrated, in the database at a given URL or in a throwaway cluster.
type proofDB struct {
	URL     string         // connections on it use the fresh schema
	Pool    *pgxpool.Pool  // on URL
	Cluster *devpg.Cluster // the throwaway cluster, if one was started (with --failover, the primary)
	Standby *devpg.Cluster // with --failover, the primary's streaming standby
	// standbyLink, with --failover, is the proxy the standby streams through.
	standbyLink *netfault.Proxy
	closers     []func()
}

// openProofDB starts a throwaway cluster when url is empty, creates a fresh
// schema, opens a pool on it and migrates it. Close drops the schema
// (unless keep) and stops the cluster.
func openProofDB(ctx context.Context, url string, keep bool) (db *proofDB, err error) {
	return openProofDBWith(ctx, url, keep, "")
}

// openProofDBWith is openProofDB, on a primary and a streaming standby
// (throwaway clusters, "sync" or "async" replication, one multi-host URL)
// when replication is set.
func openProofDBWith(ctx context.Context, url string, keep bool, replication string) (*proofDB, error) {
	return openProofDBIn(ctx, url, keep, replication, "")
}

// openProofDBIn is openProofDBWith in the schema named, when one is: created
// if absent, migrated, and kept.
func openProofDBIn(ctx context.Context, url string, keep bool, replication, schema string) (*proofDB, error) {
	db := &proofDB{}
	if err := db.open(ctx, url, keep, replication, schema); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// open is openProofDBWith on db, whose closers undo what it did.
func (db *proofDB) open(ctx context.Context, url string, keep bool, replication, schema string) (err error) {
	if url != "" {
		// A URL given is refused as relay migrate and serve refuse it:
		// another database's scheme named (the URL never echoed, it may
		// hold a password), an unreachable server in one line.
		pool, err := openPool(ctx, url, false)
		if err != nil {
			return err
		}
		pool.Close()
	}
	if replication != "" {
		if url, err = startFailoverPair(ctx, db, replication); err != nil {
			return err
		}
	}
	if url == "" {
		fmt.Println("prove: starting a throwaway PostgreSQL cluster (default settings, fsync on)")
		if db.Cluster, err = devpg.Start(ctx, devpg.Options{}); err != nil {
			return err
		}
		db.closers = append(db.closers, func() { db.Cluster.Stop() }) //nolint:errcheck
		url = db.Cluster.URL
	}
	var schemaURL string
	var drop func()
	if schema != "" {
		schemaURL, err = namedSchema(ctx, url, schema)
		keep = true
	} else {
		schemaURL, drop, err = freshSchema(ctx, url)
	}
	if err != nil {
		return err
	}
	if !keep {
		db.closers = append(db.closers, drop)
	}
	db.URL = schemaURL
	if db.Pool, err = bench.NewPool(ctx, schemaURL); err != nil {
		return err
	}
	db.closers = append(db.closers, db.Pool.Close)
	if _, err := migrations.Migrate(ctx, db.Pool); err != nil {
		return err
	}
	return nil
}

// Close releases what openProofDB made, in reverse order.
func (db *proofDB) Close() {
	for i := len(db.closers) - 1; i >= 0; i-- {
		db.closers[i]()
	}
	db.closers = nil
}

// freshSchema creates relay_prove_<random> in the database and returns a URL
// whose connections use it, and a function that drops it.
func freshSchema(ctx context.Context, dbURL string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", nil, fmt.Errorf("prove: connect: %w", err)
	}
	defer conn.Close(ctx)
	schema := fmt.Sprintf("relay_prove_%08x", rand.Uint32())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, fmt.Errorf("prove: create schema: %w", err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", nil, fmt.Errorf("prove: --database-url must be a URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, dbURL); err == nil {
			c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck
			c.Close(ctx)
		}
	}
	return u.String(), drop, nil
}

// namedSchema creates the schema named in the database if it is absent and
// returns a URL whose connections use it.
func namedSchema(ctx context.Context, dbURL, schema string) (string, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", fmt.Errorf("prove: connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return "", fmt.Errorf("prove: create schema: %w", err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("prove: --database-url must be a URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// enqueueProofJobs enqueues the proof's jobs. With --partition they arrive
// over the run, at 80% of the fleet's nominal capacity, rather than all at
// once: a job rescued from a cut-off worker then runs again at once, while
// the cut-off handler might still run, instead of waiting behind a backlog
// until the partition is long over (which would hide an overlap).
func enqueueProofJobs(ctx context.Context, pool *pgxpool.Pool, c proveConfig) error {
	var gap time.Duration
	if c.partitions > 0 {
		gap = c.jobTime * 5 / 4 / time.Duration(c.processes*c.concurrency)
	}
	first := time.Now().Add(2 * time.Second) // the workers' start
	for done := 0; done < c.jobs; {
		n := min(5000, c.jobs-done)
		params := make([]core.EnqueueParams, n)
		for i := range params {
			ms := int(float64(c.jobTime.Milliseconds()) * (0.5 + rand.Float64()))
			opts := &core.EnqueueOpts{Queue: proveQueue, MaxAttempts: 100}
			if gap > 0 {
				opts.RunAt = first.Add(time.Duration(done+i) * gap)
			}
			params[i] = core.EnqueueParams{Args: proveArgs{Seq: done + i, Ms: ms}, Opts: opts}
		}
		if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
			return err
		}
		done += n
	}
	return nil
}

// enqueueSpread enqueues the proof's jobs over the run, each due at once
// (a notification wakes the workers), at 80% of the fleet's nominal
// capacity: every 10 ms, the jobs due by then.
func enqueueSpread(ctx context.Context, pool *pgxpool.Pool, c proveConfig) error {
	gap := c.jobTime * 5 / 4 / time.Duration(c.processes*c.concurrency)
	start := time.Now().Add(2 * time.Second) // the workers' start
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for done := 0; done < c.jobs; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		due := min(c.jobs, int(time.Since(start)/max(gap, time.Microsecond)))
		if due <= done {
			continue
		}
		params := make([]core.EnqueueParams, 0, due-done)
		for i := done; i < due; i++ {
			ms := int(float64(c.jobTime.Milliseconds()) * (0.5 + rand.Float64()))
			params = append(params, core.EnqueueParams{Args: proveArgs{Seq: i, Ms: ms}, Opts: &core.EnqueueOpts{Queue: proveQueue, MaxAttempts: 100}})
		}
		if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
			return err
		}
		done = due
	}
	return nil
}

// proofPickup is the pickup latency of the proof's jobs, p50 and p99 in
// milliseconds: from when a job was due (committed, or its run_at) to the
// start of its first attempt's handler. With every job enqueued at once it
// measures the backlog; with --spread, the pickup.
func proofPickup(ctx context.Context, pool *pgxpool.Pool) (p50, p99 float64, err error) {
	err = pool.QueryRow(ctx, `
		SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), 0), coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), 0)
		FROM (SELECT extract(epoch FROM min(a.started_at) - greatest(j.created_at, j.run_at)) * 1000 AS ms
		      FROM relay_jobs AS j JOIN prove_attempts AS a ON a.job_id = j.id
		      WHERE j.kind = 'prove.job' GROUP BY j.id) AS s`).Scan(&p50, &p99)
	if err != nil {
		return 0, 0, fmt.Errorf("prove: pickup latency: %w", err)
	}
	return p50, p99, nil
}

// startProofBouncer starts a PgBouncer in transaction pooling in front of
// the proof's server, its server connections set to the proof's schema
// (PgBouncer refuses search_path as a startup parameter).
func startProofBouncer(ctx context.Context, schemaURL, schema string, poolSize int) (*devpg.Bouncer, error) {
	b, err := devpg.StartBouncer(ctx, schemaURL, devpg.BouncerOptions{ConnectQuery: "SET search_path = " + schema, PoolSize: max(poolSize, 20)})
	if err != nil {
		return nil, fmt.Errorf("prove: --pgbouncer: %w", err)
	}
	return b, nil
}

// proofBouncerURL is the workers' URL through b: exec mode (no prepared
// statements), no startup parameter PgBouncer refuses.
func proofBouncerURL(b *devpg.Bouncer) string {
	u, _ := url.Parse(b.URL)
	q := u.Query()
	q.Set("default_query_exec_mode", "exec")
	u.RawQuery = q.Encode()
	return u.String()
}

// superviseProof shows progress, fires the faults at evenly spaced points of
// progress, and returns when every job is final.
func superviseProof(ctx context.Context, pool *pgxpool.Pool, fleet *workerFleet, db *proofDB, proxies []*netfault.Proxy,
	appName string, c proveConfig, counts *proveCounts, producer *proofProducer, clock *failoverClock) error {
	cluster := db.Cluster
	type fault string
	var faults []fault
	for i := 0; i < c.kills; i++ {
		faults = append(faults, "kill")
	}
	for i := 0; i < c.sigterms; i++ {
		faults = append(faults, "sigterm")
	}
	if c.pgRestart {
		faults = append(faults, "pg-restart")
	}
	if c.pgCrash {
		faults = append(faults, "pg-crash")
	}
	if c.backendKill > 0 {
		faults = append(faults, "backend-kill")
	}
	if c.failover {
		faults = append(faults, "failover")
	}
	for i := 0; i < c.pauses; i++ {
		faults = append(faults, "pause")
	}
	for i := 0; i < c.partitions; i++ {
		faults = append(faults, "partition")
	}
	rand.Shuffle(len(faults), func(i, j int) { faults[i], faults[j] = faults[j], faults[i] })
	next := 0
	var pauses sync.WaitGroup // pauses and partitions, which run in the background
	var pauseMu sync.Mutex
	tty := isTerminal()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastPrint := time.Time{}
	for {
		var done, total int
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state IN ('succeeded', 'dead', 'cancelled')), count(*)
			FROM relay_jobs WHERE kind = 'prove.job'`).Scan(&done, &total); err != nil {
			// The server may be restarting, or failing over.
			if ctx.Err() != nil {
				return fmt.Errorf("prove: %w", ctx.Err())
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		clock.observe(done)
		// Every job final: all of them, or with a producer, all it enqueued
		// once it is done (an acknowledged enqueue lost in a failover is
		// counted by the audit, not waited for).
		finished := done == c.jobs
		if producer != nil {
			ended, err := producer.finished()
			if err != nil {
				return err
			}
			finished = ended && done == total
		}
		if time.Since(lastPrint) > time.Second || finished {
			line := fmt.Sprintf("prove: done %d/%d  kills %d/%d  sigterms %d/%d  restarts %d", done, c.jobs, counts.kills, c.kills, counts.terms, c.sigterms, fleet.restarts())
			if tty {
				fmt.Printf("\r%s ", line)
			} else {
				fmt.Println(line)
			}
			lastPrint = time.Now()
		}
		if finished {
			if tty {
				fmt.Println()
			}
			pauses.Wait()
			if next < len(faults) {
				return fmt.Errorf("prove: the jobs finished before %d of the %d faults fired; use more jobs or a longer --job-time", len(faults)-next, len(faults))
			}
			return nil
		}
		// Fault i fires when progress passes (i+1)/(faults+1) of the first
		// 60% of the jobs, leaving the rest of the run to recover. With a
		// producer, progress is the jobs enqueued: a failover must come
		// while enqueues are committing, however far behind the workers are.
		progress := done
		if producer != nil {
			progress = producer.ackedCount()
		}
		if next < len(faults) && progress >= (next+1)*c.jobs*6/10/(len(faults)+1) {
			switch faults[next] {
			case "kill":
				if err := fleet.kill(func(id string) error { return recordKill(ctx, pool, id) }); err != nil {
					return err
				}
				counts.kills++
			case "sigterm":
				if err := fleet.term(); err != nil {
					return err
				}
				counts.terms++
			case "pg-restart":
				fmt.Println("\nprove: restarting PostgreSQL")
				if err := cluster.Restart(ctx); err != nil {
					return err
				}
			case "pg-crash":
				fmt.Println("\nprove: crashing PostgreSQL (immediate shutdown)")
				if err := cluster.Crash(ctx); err != nil {
					return err
				}
			case "pause":
				// In the background: a pause lasts until another worker
				// takes the job over, and the other faults must not wait.
				pauses.Add(1)
				go func() {
					defer pauses.Done()
					// A pause whose job was not taken over tested nothing:
					// try another worker, a few times.
					for try := 0; try < 10; try++ {
						if fleet.pause(ctx, pool) {
							pauseMu.Lock()
							counts.pauses++
							pauseMu.Unlock()
							return
						}
					}
				}()
			case "partition":
				pauses.Add(1)
				go func() {
					defer pauses.Done()
					if fleet.partition(ctx, proxies, c.partitionFor) {
						pauseMu.Lock()
						counts.partitions++
						pauseMu.Unlock()
					}
				}()
			case "backend-kill":
				go terminateBackends(ctx, pool, appName, c.backendKill, c.backendKillD, &counts.backendKills)
			case "failover":
				if err := failover(ctx, db, clock, c.lag); err != nil {
					return err
				}
			}
			next++
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("prove: gave up: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// terminateBackends kills perSecond random connections of this run's
// workers (application_name appName or one of the names their clients
// derive from it, in this database) every second for d,
// counting those it killed.
func terminateBackends(ctx context.Context, pool *pgxpool.Pool, appName string, perSecond int, d time.Duration, killed *atomic.Int64) {
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		var n int64
		err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
			SELECT pid FROM pg_stat_activity
			WHERE application_name LIKE $1 || '%' AND datname = current_database() AND pid <> pg_backend_pid()
			ORDER BY random() LIMIT $2) AS victims`, appName, perSecond).Scan(&n)
		if err == nil {
			killed.Add(n)
		}
		time.Sleep(time.Second)
	}
}

// lockStorm locks a random running job's row (of kind), as a caller's long
// transaction would (a Cancel inside it, say), holds it for hold, and
// starts over after a pause of hold/2 on another job, until ctx ends. (A
// storm that re-locked the same row at once, forever, would keep its job
// from ever being rescued: no caller does that.) It counts the locks it
// held.
func lockStorm(ctx context.Context, pool *pgxpool.Pool, kind string, hold time.Duration, locks *atomic.Int64) {
	var last int64
	for ctx.Err() == nil {
		tx, err := pool.Begin(ctx)
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		var id int64
		err = tx.QueryRow(ctx, `SELECT id FROM relay_jobs WHERE state = 'claimed' AND kind = $2 AND id <> $1
			ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED`, last, kind).Scan(&id)
		if err != nil {
			tx.Rollback(context.Background()) //nolint:errcheck
			time.Sleep(50 * time.Millisecond)
			continue
		}
		locks.Add(1)
		last = id
		select {
		case <-ctx.Done():
		case <-time.After(hold):
		}
		tx.Rollback(context.Background()) //nolint:errcheck
		select {
		case <-ctx.Done():
		case <-time.After(hold / 2):
		}
	}
}

func audit(ctx context.Context, pool *pgxpool.Pool) (map[string]int64, error) {
	res := map[string]int64{}
	for _, block := range strings.Split(proveAudit, "-- name: ")[1:] {
		name, query, _ := strings.Cut(block, "\n")
		var n int64
		if err := retryDB(ctx, "audit "+name, func(ctx context.Context) error { return pool.QueryRow(ctx, query).Scan(&n) }); err != nil {
			return nil, err
		}
		res[strings.TrimSpace(name)] = n
	}
	return res, nil
}

// workerFleet runs a proof's worker processes: this binary, with the
// arguments argv gives for each process id.
type workerFleet struct {
	argv func(id string) []string
	// slotArgs, if set, adds arguments for the process in a slot.
	slotArgs func(slot int) []string
	// sink, if set, is told of SIGKILLs and SIGSTOPs.
	sink         *proofSink
	partitioning sync.Mutex    // one partition at a time
	lease        time.Duration // for pause: how long a takeover can take
	mu           sync.Mutex
	cmds         []*exec.Cmd
	ids          []string
	paused       map[int]bool // slots SIGSTOPped by pause: kill and term pick others
	gen          int
}

// pick returns a random slot that is not paused, and marks it paused if
// pause is set. A SIGTERM to a stopped process waits until it is continued,
// so term must not pick one.
func (f *workerFleet) pick(pause bool) (slot int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if pause {
		if f.paused == nil {
			f.paused = map[int]bool{}
		}
		defer func() { f.paused[slot] = true }()
	}
	var free []int
	for slot := range f.cmds {
		if !f.paused[slot] {
			free = append(free, slot)
		}
	}
	if len(free) == 0 {
		return rand.IntN(len(f.cmds))
	}
	return free[rand.IntN(len(free))]
}

func (f *workerFleet) start(slot int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	f.gen++
	id := fmt.Sprintf("w%d-g%d", slot, f.gen)
	argv := f.argv(id)
	if f.slotArgs != nil {
		argv = append(argv, f.slotArgs(slot)...)
	}
	cmd := exec.Command(self, argv...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // our Ctrl-C is ours to relay
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("prove: start worker: %w", err)
	}
	for len(f.cmds) <= slot {
		f.cmds = append(f.cmds, nil)
		f.ids = append(f.ids, "")
	}
	f.cmds[slot], f.ids[slot] = cmd, id
	return nil
}

func (f *workerFleet) restarts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gen - len(f.cmds)
}

// kill SIGKILLs a random worker, calls killed with its id once it is gone,
// and restarts it.
func (f *workerFleet) kill(killed func(id string) error) error {
	slot := f.pick(false)
	f.mu.Lock()
	cmd, id := f.cmds[slot], f.ids[slot]
	f.mu.Unlock()
	cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck
	cmd.Wait()                          //nolint:errcheck
	if f.sink != nil {
		f.sink.killed(id)
	}
	if killed != nil {
		if err := killed(id); err != nil {
			return err
		}
	}
	return f.start(slot)
}

// killOnSchedule SIGKILLs (and restarts) a worker when progress passes the
// next of kills points spread evenly over the first 60% of total, leaving
// the rest of the run to recover. It returns the kills made so far.
func (f *workerFleet) killOnSchedule(killed, kills, progress, total int) (int, error) {
	if killed < kills && progress >= (killed+1)*total*6/10/(kills+1) {
		if err := f.kill(nil); err != nil {
			return killed, err
		}
		killed++
	}
	return killed, nil
}

// recordKill notes in the queue proof's table when a worker was dead
// (after the process is gone: its attempts ended no later).
func recordKill(ctx context.Context, pool *pgxpool.Pool, id string) error {
	for try := 0; ; try++ {
		_, err := pool.Exec(ctx, `INSERT INTO prove_kills (worker) VALUES ($1)`, id)
		if err == nil {
			break
		}
		if try > 50 {
			return fmt.Errorf("prove: record kill: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// term SIGTERMs a random worker, waits for it to drain and exit, and
// restarts it.
func (f *workerFleet) term() error {
	slot := f.pick(false)
	f.mu.Lock()
	cmd := f.cmds[slot]
	f.mu.Unlock()
	cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("prove: worker did not exit cleanly on SIGTERM: %w", err)
	}
	return f.start(slot)
}

// pause SIGSTOPs a worker that holds jobs, waits until its lease on one of
// them has ended (it expired and the job was rescued), then SIGCONTs the
// paused one: it wakes up past its lease, and the fence must refuse its
// result. It says whether that happened. The job is chosen after the stop,
// among the stopped worker's claimed jobs whose rows it does not hold
// locked: a worker stopped inside a transaction holding a job's row (in
// CompleteTx, say) keeps that job from being rescued, and so a job picked
// before the stop could land there and test nothing; a job picked after
// it, unlocked, cannot be locked or finished by a stopped process, so only
// a rescue can end its lease.
func (f *workerFleet) pause(ctx context.Context, pool *pgxpool.Pool) bool {
	slot := f.pick(true)
	f.mu.Lock()
	cmd, id := f.cmds[slot], f.ids[slot]
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.paused, slot)
		f.mu.Unlock()
	}()
	// Wait (bounded) until the worker holds a job, so the stop finds some.
	holds := func() bool {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM relay_jobs WHERE state = 'claimed' AND attempted_by = $1`, id).Scan(&n) //nolint:errcheck
		return n > 0
	}
	for deadline := time.Now().Add(10 * time.Second); !holds() && time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGSTOP) //nolint:errcheck
	if f.sink != nil {
		defer f.sink.stopped(id)()
	}
	defer cmd.Process.Signal(syscall.SIGCONT) //nolint:errcheck
	jobID, token := unlockedClaim(ctx, pool, id)
	if jobID == 0 {
		fmt.Printf("\nprove: %s held no job outside a transaction of its own when stopped; resuming it, trying again\n", id)
		return false
	}
	fmt.Printf("\nprove: paused %s holding job %d\n", id, jobID)
	// Taken over: the rescuer ended the paused attempt's lease (the job may
	// then wait behind the backlog before another worker runs it; the fence
	// refuses the paused worker's writes from now on either way).
	deadline := time.Now().Add(3*f.lease + 5*time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var taken bool
		pool.QueryRow(ctx, `SELECT lease_token IS DISTINCT FROM $2::uuid FROM relay_jobs WHERE id = $1`, jobID, token).Scan(&taken) //nolint:errcheck
		if taken {
			fmt.Printf("prove: job %d taken over (lease ended by a rescue); resuming %s\n", jobID, id)
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("prove: job %d was not taken over in time; resuming %s, trying again\n", jobID, id)
	return false
}

// unlockedClaim returns one of worker's claimed jobs (id and lease token)
// whose row no transaction holds locked, or 0. (A statement of a
// transaction the worker sent just before it was stopped could still lock
// the row after the choice: then the job is not taken over in time, and
// the caller tries again.)
func unlockedClaim(ctx context.Context, pool *pgxpool.Pool, worker string) (int64, string) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, ""
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var jobID int64
	var token string
	err = tx.QueryRow(ctx, `SELECT id, lease_token::text FROM relay_jobs WHERE state = 'claimed' AND attempted_by = $1
		ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`, worker).Scan(&jobID, &token)
	if err != nil {
		return 0, ""
	}
	return jobID, token
}

// partition cuts a random worker's proxy for d, then restores it. It says
// whether the cut lasted its full length (not cut short by the run's end).
func (f *workerFleet) partition(ctx context.Context, proxies []*netfault.Proxy, d time.Duration) bool {
	// One worker at a time: a partition, not an outage.
	f.partitioning.Lock()
	defer f.partitioning.Unlock()
	slot := f.pick(true) // kill, term and pause pick others meanwhile
	defer func() {
		f.mu.Lock()
		delete(f.paused, slot)
		f.mu.Unlock()
	}()
	f.mu.Lock()
	id := f.ids[slot]
	f.mu.Unlock()
	proxies[slot].Cut()
	fmt.Printf("\nprove: cut %s off from PostgreSQL for %s\n", id, d)
	full := true
	select {
	case <-ctx.Done():
		full = false
	case <-time.After(d):
	}
	proxies[slot].Restore()
	fmt.Printf("prove: %s reconnected\n", id)
	return full
}

func (f *workerFleet) stopAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, cmd := range f.cmds {
		if cmd != nil && cmd.ProcessState == nil {
			cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck
		}
	}
	for _, cmd := range f.cmds {
		if cmd != nil && cmd.ProcessState == nil {
			cmd.Wait() //nolint:errcheck
		}
	}
}

func isTerminal() bool {
	fi, err := os.Stdout.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
