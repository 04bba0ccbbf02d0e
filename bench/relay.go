package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/migrations"
)

// Relay is the System for this repository's core queue. The zero value
// inserts jobs without an ordering key.
type Relay struct {
	// Keys, when set, gives every inserted job an ordering key drawn from
	// it (the outbox-shaped load of issue 17).
	Keys *KeyPicker
	// Queues, when above 1, spreads the inserted jobs at random over this
	// many queues, "q0" … "q<n-1>", instead of the default queue (the
	// workers serve them all: WorkerConfig.Queues).
	Queues int
	// DueAt, when set, is every batch-inserted job's RunAt and stamp: a
	// burn-down of jobs that all become due at once, whose pickup counts
	// from that moment.
	DueAt time.Time
	// producer, when set, enqueues (ForProducers); else the package-level
	// core.Enqueue does.
	producer *core.Client
}

// ForProducers is the Relay a steady run's producers insert with: through
// an insert-only Client whose EnqueueWakeCoalesce is the workers'
// ClaimCoalesce (producerWake), as the documentation advises, so that its
// enqueues wake the workers at most once per claim window. With ordering
// keys the producers enqueue in a transaction of their own, whose commit
// notifies, uncoalesced: the client changes nothing there.
func (r Relay) ForProducers(pool *pgxpool.Pool, cfg WorkerConfig) (System, error) {
	c, err := core.NewClient(pool, &core.Config{EnqueueWakeCoalesce: producerWake(cfg), Logger: benchLogger()})
	if err != nil {
		return nil, err
	}
	r.producer = c
	return r, nil
}

// producerWake is the producers' EnqueueWakeCoalesce for workers
// configured with cfg: their ClaimCoalesce when it is longer than the
// default (1 ms), at most 1 s; else 0, the default.
func producerWake(cfg WorkerConfig) time.Duration {
	if cfg.ClaimCoalesce <= time.Millisecond {
		return 0
	}
	return min(cfg.ClaimCoalesce, time.Second)
}

// enqueue writes one job through db: the producer client's, or the
// package-level Enqueue.
func (r Relay) enqueue(ctx context.Context, db core.DB, args core.JobArgs, opts *core.EnqueueOpts) error {
	var err error
	if r.producer != nil {
		_, err = r.producer.EnqueueTx(ctx, db, args, opts)
	} else {
		_, err = core.Enqueue(ctx, db, args, opts)
	}
	return err
}

// KeyPicker draws ordering keys "k0" … "k<n-1>", Zipf-distributed (s =
// 1.1: a few hot keys, a long tail), safe for concurrent use.
type KeyPicker struct {
	mu    sync.Mutex
	zipf  *rand.Zipf
	cycle bool // instead of zipf: NewCyclingKeyPicker
	n     int
	next  uint64
}

// NewKeyPicker returns a picker over n keys.
func NewKeyPicker(n int) *KeyPicker {
	return &KeyPicker{zipf: rand.NewZipf(rand.New(rand.NewSource(1)), 1.1, 1, uint64(n-1))}
}

// NewCyclingKeyPicker returns a picker over n keys that takes each in
// turn: n jobs get n distinct keys, none of them hot.
func NewCyclingKeyPicker(n int) *KeyPicker {
	return &KeyPicker{cycle: true, n: n}
}

func (p *KeyPicker) opts() *core.EnqueueOpts {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	var k uint64
	if p.cycle {
		k = p.next
		p.next = (p.next + 1) % uint64(p.n)
	} else {
		k = p.zipf.Uint64()
	}
	p.mu.Unlock()
	return &core.EnqueueOpts{OrderingKey: "k" + strconv.FormatUint(k, 10)}
}

// opts is the enqueue options of one inserted job: its ordering key, its
// queue and its due time, as r is configured.
func (r Relay) opts() *core.EnqueueOpts {
	o := r.Keys.opts()
	if r.Queues <= 1 && r.DueAt.IsZero() {
		return o
	}
	if o == nil {
		o = &core.EnqueueOpts{}
	}
	if r.Queues > 1 {
		o.Queue = queueName(rand.Intn(r.Queues))
	}
	if !r.DueAt.IsZero() {
		o.RunAt = r.DueAt
	}
	return o
}

func queueName(i int) string { return "q" + strconv.Itoa(i) }

type benchArgs struct {
	Stamp int64 `json:"s"`
}

func (benchArgs) Kind() string { return "bench" }

func (Relay) Name() string  { return "relay" }
func (Relay) Table() string { return "relay_jobs" }

// relayConfig is the client configuration the benchmarks use: the
// defaults, but for the slots.
// With cfg.Queues above 1 it serves that many queues, each with an equal
// share of the slots (at least one).
func relayConfig(cfg WorkerConfig, ws *core.Workers) *core.Config {
	queues := map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: cfg.Workers, Prefetch: cfg.Prefetch}}
	if cfg.Queues > 1 {
		queues = make(map[string]core.QueueConfig, cfg.Queues)
		for i := range cfg.Queues {
			queues[queueName(i)] = core.QueueConfig{MaxWorkers: max(1, cfg.Workers/cfg.Queues), Prefetch: cfg.Prefetch}
		}
	}
	return &core.Config{
		Workers:       ws,
		Queues:        queues,
		Logger:        benchLogger(),
		ClaimCoalesce: cfg.ClaimCoalesce,
		NoClaimFloor:  cfg.NoClaimFloor,

		SynchronousClaims: cfg.SynchronousClaims,
	}
}

func (Relay) Describe(cfg WorkerConfig) string {
	c := relayConfig(cfg, nil)
	q := c.Queues[core.DefaultQueue]
	if cfg.Queues > 1 {
		q = c.Queues[queueName(0)]
	}
	coalesce := "default"
	if c.ClaimCoalesce != 0 {
		coalesce = c.ClaimCoalesce.String()
	}
	if c.ClaimCoalesce < 0 {
		coalesce = "off"
	}
	wake := "default (1ms)"
	if w := producerWake(cfg); w > 0 {
		wake = w.String()
	}
	return fmt.Sprintf("%d queue(s), MaxWorkers %d each, Prefetch %d, ClaimCoalesce %s, NoClaimFloor %v, SynchronousClaims %v, defaults otherwise (FetchLimit 1000, PollInterval 1s, LISTEN/NOTIFY on); steady runs' producers (without --keys): a Client with EnqueueWakeCoalesce %s",
		len(c.Queues), q.MaxWorkers, q.Prefetch, coalesce, c.NoClaimFloor, c.SynchronousClaims, wake)
}

func (Relay) Setup(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := migrations.Migrate(ctx, pool)
	return err
}

func (Relay) Reset(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `TRUNCATE relay_jobs`)
	return err
}

func (r Relay) InsertBatch(ctx context.Context, pool *pgxpool.Pool, n int) error {
	stamp := time.Now().UnixNano()
	if !r.DueAt.IsZero() {
		stamp = r.DueAt.UnixNano()
	}
	params := make([]core.EnqueueParams, n)
	for i := range params {
		params[i] = core.EnqueueParams{Args: benchArgs{Stamp: stamp}, Opts: r.opts()}
	}
	_, err := core.EnqueueMany(ctx, pool, params)
	return err
}

func (r Relay) InsertOne(ctx context.Context, pool *pgxpool.Pool, stamp time.Time) error {
	opts := r.opts()
	if opts == nil || opts.OrderingKey == "" {
		return r.enqueue(ctx, pool, benchArgs{Stamp: stamp.UnixNano()}, opts)
	}
	// Producers of one key serialise on a lock taken before the job's id
	// is drawn, as outbox.Publish does, so that a key's ids follow commit
	// order: the order the jobs must run in.
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, opts.OrderingKey); err != nil {
			return err
		}
		return r.enqueue(ctx, tx, benchArgs{Stamp: stamp.UnixNano()}, opts)
	})
}

// FillFinished writes succeeded rows directly. The insert trigger admits
// only queued rows, so it is switched off for this one statement (in a
// transaction, so nothing else sees it off).
func (Relay) FillFinished(ctx context.Context, pool *pgxpool.Pool, n int) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	for _, q := range []string{
		`ALTER TABLE relay_jobs DISABLE TRIGGER USER`,
		fmt.Sprintf(`INSERT INTO relay_jobs (kind, args, state, attempt, attempted_at, attempted_by, finalized_at)
		 SELECT 'fill', '{"s":0}', 'succeeded', 1, now(), 'fill', now() FROM generate_series(1, %d)`, n),
		`ALTER TABLE relay_jobs ENABLE TRIGGER USER`,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// FillScheduled inserts n queued jobs due in a day, of a kind no bench
// worker handles, spread as r spreads its jobs over queues: a backlog of
// scheduled work in the claim index beside the measured jobs.
func (r Relay) FillScheduled(ctx context.Context, pool *pgxpool.Pool, n int) error {
	queue := `'default'`
	if r.Queues > 1 {
		queue = fmt.Sprintf(`'q' || (i %% %d)`, r.Queues)
	}
	_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO relay_jobs (kind, queue, run_at)
		SELECT 'future', %s, now() + interval '1 day' + i * interval '1 ms' FROM generate_series(1, %d) AS i`, queue, n))
	if err != nil {
		return fmt.Errorf("fill scheduled jobs: %w", err)
	}
	return nil
}

// FillKeyBacklog gives ordering key "hot" a running head (claimed, with an
// hour-long lease: a stuck or slow delivery) and n-1 queued jobs behind it,
// enqueued an hour in the past so that they come first in claim order:
// the outbox's hot-key case beside which a burn-down then runs (issue 17).
// The backlog is of a kind no bench worker handles; only its head could
// run, and it is held.
func (Relay) FillKeyBacklog(ctx context.Context, pool *pgxpool.Pool, n int) error {
	if n <= 0 {
		return nil
	}
	for _, q := range []string{
		`INSERT INTO relay_jobs (kind, ordering_key, run_at) VALUES ('backlog', 'hot', now() - interval '1 hour')`,
		`UPDATE relay_jobs SET state = 'claimed', attempt = 1, attempted_at = now(), attempted_by = 'bench',
		        lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour'
		 WHERE kind = 'backlog'`,
		fmt.Sprintf(`INSERT INTO relay_jobs (kind, ordering_key, run_at)
		 SELECT 'backlog', 'hot', now() - interval '1 hour' FROM generate_series(2, %d)`, n),
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("fill key backlog: %w", err)
		}
	}
	return nil
}

// OrderCheck is what Relay.OrderViolations found.
type OrderCheck struct {
	// Jobs is the number of keyed jobs whose handler started before the
	// previous job of their key (by id: the order in which they were
	// enqueued) had finished, on Keys keys.
	Jobs, Keys int64
	// CommitTimes says whether "finished" was the commit of the previous
	// job's outcome (track_commit_timestamp is on): the check is then
	// exact. Otherwise it is the start of the transaction that wrote the
	// outcome (finalized_at), which precedes its commit: a handler that
	// started during that transaction is not counted.
	CommitTimes bool
	// Unreported is the number of succeeded keyed jobs whose handler start
	// no worker process reported: the check could not see them.
	Unreported int64
	// ClaimedEarly is the number of keyed jobs whose claim's now() precedes
	// the previous job's completion's now(). It is not a count of order
	// violations: now() is the start of each transaction, and a claim's
	// transaction can start before the completion's and still take its
	// snapshot after that completion committed (docs/ordering-keys.md).
	ClaimedEarly int64
}

// OrderViolations checks the order of the keyed bench jobs: each job's
// handler start (started, Result.KeyedStarts, by the worker processes'
// clock) against the commit of its key's previous job's outcome (by
// PostgreSQL's clock: the worker processes must run on the database's
// machine).
func (Relay) OrderViolations(ctx context.Context, pool *pgxpool.Pool, started map[int64]int64) (OrderCheck, error) {
	var c OrderCheck
	if err := pool.QueryRow(ctx, `SELECT current_setting('track_commit_timestamp')::bool`).Scan(&c.CommitTimes); err != nil {
		return c, err
	}
	ids := make([]int64, 0, len(started))
	starts := make([]int64, 0, len(started))
	for id, us := range started {
		ids = append(ids, id)
		starts = append(starts, us)
	}
	// A finished job's row was last written by its outcome (nothing in a
	// run updates it after), so its xmin is the outcome's transaction.
	err := pool.QueryRow(ctx, `
		WITH s AS (SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS s(id, started_us)),
		j AS (
		    SELECT j.id, j.queue, j.ordering_key, j.state, j.attempted_at, j.finalized_at, s.started_us,
		           (extract(epoch FROM coalesce(CASE WHEN $3 THEN pg_xact_commit_timestamp(j.xmin) END,
		                                        j.finalized_at)) * 1000000)::bigint AS done_us
		    FROM relay_jobs AS j LEFT JOIN s ON s.id = j.id
		    WHERE j.kind = 'bench' AND j.ordering_key IS NOT NULL),
		t AS (
		    SELECT ordering_key, state, started_us, attempted_at,
		           lag(done_us) OVER w AS prev_done_us, lag(finalized_at) OVER w AS prev_finalized
		    FROM j WINDOW w AS (PARTITION BY queue, ordering_key ORDER BY id))
		SELECT count(*) FILTER (WHERE started_us < prev_done_us),
		       count(DISTINCT ordering_key) FILTER (WHERE started_us < prev_done_us),
		       count(*) FILTER (WHERE state = 'succeeded' AND started_us IS NULL),
		       count(*) FILTER (WHERE attempted_at < prev_finalized)
		FROM t`, ids, starts, c.CommitTimes).Scan(&c.Jobs, &c.Keys, &c.Unreported, &c.ClaimedEarly)
	return c, err
}

func (Relay) EndToEnd(ctx context.Context, pool *pgxpool.Pool) (p50, p95, p99 time.Duration, err error) {
	return EndToEndQuery(ctx, pool, `
		SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM finalized_at - created_at))
		FROM relay_jobs WHERE state = 'succeeded' AND kind = 'bench'`)
}

func (Relay) Work(ctx context.Context, pool *pgxpool.Pool, cfg WorkerConfig, hooks Hooks) error {
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[benchArgs](func(_ context.Context, j *core.Job[benchArgs]) error {
		if j.OrderingKey != "" && hooks.KeyedStarted != nil {
			hooks.KeyedStarted(j.ID, time.Now())
		}
		hooks.Started(j.Args.Stamp)
		hooks.Worked(cfg.Job.Do())
		return nil
	}))
	client, err := core.NewClient(pool, relayConfig(cfg, ws))
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	if err := WaitListening(ctx, pool, "relay-listener "+client.ID()); err != nil {
		return err
	}
	hooks.ready()
	// Stats has no completion event to subscribe to (River's hook is one):
	// poll it often, so the end of a run is seen within a millisecond.
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
		hooks.Completed(client.Stats().Succeeded)
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = client.Stop(stopCtx)
	hooks.Completed(client.Stats().Succeeded)
	return err
}

// WaitListening waits, up to 30 s, until the connection named appName
// has run its LISTEN statements: a job inserted before it would wait for
// the next poll.
func WaitListening(ctx context.Context, pool *pgxpool.Pool, appName string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var ok bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE application_name = $1 AND state = 'idle' AND query ILIKE 'listen%')`, appName).Scan(&ok)
		if err != nil {
			return fmt.Errorf("wait for %s: %w", appName, err)
		}
		if ok {
			return nil
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			return fmt.Errorf("wait for %s: %w", appName, err)
		}
	}
}

// EndToEndQuery runs a query returning a float8[] of three quantiles in
// seconds, for System.EndToEnd.
func EndToEndQuery(ctx context.Context, pool *pgxpool.Pool, sql string) (p50, p95, p99 time.Duration, err error) {
	var qs []*float64
	if err := pool.QueryRow(ctx, sql).Scan(&qs); err != nil {
		return 0, 0, 0, err
	}
	d := func(i int) time.Duration {
		if i >= len(qs) || qs[i] == nil {
			return 0
		}
		return time.Duration(*qs[i] * float64(time.Second))
	}
	return d(0), d(1), d(2), nil
}

// benchLogger is the clients' logger: discarded, unless RELAY_BENCH_LOG is
// set (to investigate a run: the claim floor going on and off, a listener
// reconnecting), when it writes to stderr.
func benchLogger() *slog.Logger {
	if os.Getenv("RELAY_BENCH_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
