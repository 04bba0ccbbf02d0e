package core

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/internal/appname"
	"github.com/relayq/relay/internal/jobinsert"
	"github.com/relayq/relay/internal/liveness"
	"github.com/relayq/relay/internal/notifier"
)

// Config configures a Client. The zero value of every field is a sensible
// default; a Config with only Workers set serves the "default" queue with 10
// workers.
type Config struct {
	// Workers run the jobs this client claims. Nil makes an enqueue-only
	// client that claims nothing.
	Workers *Workers
	// Queues maps each queue this client serves to its settings. Empty means
	// {"default": {MaxWorkers: 10}} when Workers is set.
	Queues map[string]QueueConfig
	// ID names this client in leases and logs (attempted_by). Default:
	// hostname-pid-random.
	ID string
	// LeaseDuration is how long a claim holds a job without a heartbeat.
	// A worker that dies loses its jobs' leases this long after its last
	// heartbeat. Default 30s.
	LeaseDuration time.Duration
	// HeartbeatInterval is how often running jobs' leases are renewed.
	// Default LeaseDuration/3; at most 40% of LeaseDuration, so that a
	// lease has two chances to be renewed before its local deadline (see
	// the README's "Leases").
	HeartbeatInterval time.Duration
	// SynchronousClaims makes a claim commit as the session's other commits
	// do (synchronous_commit, on by default: after its WAL flush and, with
	// synchronous replication, once a synchronous standby has it). By
	// default a claim commits asynchronously: after a crash or a failover
	// the claim can be missing, its job queued again and claimed by another
	// worker while the first handler still runs, until that handler's next
	// heartbeat finds its lease gone (its writes are fenced throughout).
	// With SynchronousClaims a claim that a handler runs under survives a
	// failover to a synchronous standby, and the two attempts cannot
	// overlap; each claim statement then waits for a WAL flush and, with
	// synchronous replication, a round trip to the standby.
	SynchronousClaims bool
	// PollInterval is the fallback fetch period when no notification comes.
	// Default 1s. It is the pickup latency (up to) of a client that does
	// not listen (see ListenerURL).
	PollInterval time.Duration
	// ListenerURL is the connection string of the client's LISTEN
	// connection, which learns of new jobs and cancellations. Empty: the
	// pool's settings. A LISTEN does not outlive its transaction through a
	// transaction-pooling proxy (PgBouncer's pool_mode=transaction): give
	// such a client a URL that reaches the server directly (or through a
	// session-pooling proxy). Without one, a client that finds its pool
	// pooled per transaction at Start says so once and does not listen:
	// its workers find new jobs every PollInterval, and a running job's
	// cancellation at its next heartbeat.
	ListenerURL string
	// ClaimCoalesce is the shortest time between two claims of a queue that
	// notifications trigger. A notification that comes sooner after the
	// previous claim waits out the rest of it, and one claim then takes
	// every job notified meanwhile; one after a quiet spell claims at once,
	// so a lone job waits for nothing. Under a steady load this bounds
	// claims to one per ClaimCoalesce per queue and process, instead of one
	// per job: fewer statements, and less PostgreSQL CPU per job, for at
	// most this much more pickup latency. A drain (the last claim took all
	// it asked for) is not slowed: a freed slot claims at once. Default 1ms
	// (docs/benchmarks.md, "Steady load: PostgreSQL CPU per job");
	// negative claims on every notification. A window longer than 1 ms
	// saves claims but not the producers' wake-ups: give the producers'
	// clients the same EnqueueWakeCoalesce. Measured at a steady 1,000
	// jobs/s on a quiet 2-vCPU VM, cluster on tmpfs (docs/benchmarks.md,
	// "Steady load"), both settings alike: 1ms (the default) spent 1.53×
	// River's PostgreSQL CPU per job for a pickup p50 / p99 of 1.8 / 3.7 ms
	// against River's 13.5 / 30; 2ms 1.25× at 2.2 / 4.2 ms; 5ms 1.06× at
	// 3.9 / 7.1 ms (CPU figures move ±20% a round). A lone caller's
	// workflow waits 7–9% longer at 2ms than at 1ms.
	ClaimCoalesce time.Duration
	// EnqueueWakeCoalesce is the shortest time between two wake-ups of a
	// queue's workers that this client's enqueues on a pool send (Enqueue,
	// EnqueueMany, and the Tx forms given a pool; an enqueue in a caller's
	// transaction notifies at its commit, uncoalesced). An enqueue that
	// commits sooner after the pool's last wake-up of its queue leaves its
	// wake-up to one sent when the window is up, which covers every job
	// committed meanwhile. A process that exits while one waits drops it
	// (its jobs then wait for the workers' next poll): call Stop before
	// exiting, which sends those waiting on the client's pool (not on other
	// pools given to EnqueueTx), within at most 1 s of Stop's context. Set
	// it to the workers' ClaimCoalesce when that is longer:
	// the workers claim once per window anyway, so the wake-ups in between
	// cost PostgreSQL CPU (a statement, and a delivery to every listening
	// client) for nothing. A window longer than the workers' adds up to
	// the difference to their pickup latency. It applies to every queue
	// the client enqueues to. Default 1ms (as the package-level Enqueue);
	// at most 1s.
	EnqueueWakeCoalesce time.Duration
	// FetchLimit caps the jobs one claim statement takes (a claim takes no
	// more than the free workers either). Large batches are cheaper per job:
	// a burn-down with 2,000 workers drains about 40% faster at 1,000 than at
	// 100 (docs/benchmarks.md). Default 1000.
	FetchLimit int
	// NoClaimFloor turns off the claim floor, which keeps claims from
	// walking the dead index entries that pile up while VACUUM
	// falls behind (a long transaction holding the xmin horizon), at the
	// price of a relaxed order for late priority-0 jobs while it is on.
	// For measurement, or where that order matters more than claim cost.
	NoClaimFloor bool
	// RescueInterval is how often expired leases are looked for. Default
	// LeaseDuration/2. Negative disables the rescuer in this client.
	// (Ordering keys handed off for a re-fix, docs/ordering-keys.md, and
	// wake-ups handed off over a held row are taken by every client with
	// workers, on notification and every few seconds, whatever this is.)
	RescueInterval time.Duration
	// Retention says how long finished jobs are kept. See Retention.
	Retention Retention
	// RetryPolicy computes retry delays for kinds whose worker has none.
	// Default Backoff{} (1s doubling to 1h, 10% jitter).
	RetryPolicy RetryPolicy
	// Logger receives the client's logs. Default slog.Default().
	Logger *slog.Logger
	// TracerProvider makes each attempt's span. Default: the global one
	// (otel.SetTracerProvider); with none set, tracing costs next to
	// nothing. The client's Enqueue methods use it too; the package-level
	// Enqueue and EnqueueMany use the global provider.
	TracerProvider trace.TracerProvider
	// TraceMode relates attempts' spans to the enqueue's: TraceParent (one
	// trace per job, the default) or TraceLink.
	TraceMode TraceMode
	// MeterProvider makes the client's metrics (see docs/observability.md),
	// the client's Enqueue methods' relay.jobs.enqueued included. Default:
	// the global one (otel.SetMeterProvider).
	MeterProvider metric.MeterProvider
	// LivenessTimeout is how long the client's entry in the table of live
	// processes (relay_processes: host, pid, version, queues and their
	// slots; the admin API's GET /v1/processes) outlives its last
	// heartbeat. A started client records it at Start, renews it every
	// quarter of this (one statement each time, on the client's
	// bookkeeping pool, never per claim), and deletes it at Stop; a killed
	// process's entry ages out this long after its last heartbeat,
	// deleted by whichever live process heartbeats next. Default 1m.
	LivenessTimeout time.Duration
}

// defaultClaimCoalesce is Config.ClaimCoalesce's default: see
// docs/benchmarks.md, "Steady load: PostgreSQL CPU per job", for the
// trade-off it was chosen on.
const defaultClaimCoalesce = time.Millisecond

// QueueConfig configures one queue of a Client.
type QueueConfig struct {
	// MaxWorkers is how many jobs of the queue run at once. Default 10.
	MaxWorkers int
	// Prefetch is how many jobs beyond MaxWorkers the client may hold claimed,
	// waiting for a worker to free up, while every worker is busy. A worker
	// that finishes then starts the next job at once instead of waiting for a
	// claim round trip: worth it for short jobs on few workers. A prefetched
	// job waits behind running ones even when another process is idle, and a
	// crash burns its attempt like a running job's, so keep it small. Default
	// 0.
	Prefetch int
}

// Retention says how long finished jobs are kept before deletion. Zero means
// the default; negative keeps them forever.
type Retention struct {
	Succeeded time.Duration // default 24h
	Cancelled time.Duration // default 7 days
	Dead      time.Duration // default 30 days
	// Interval is how often the cleaner runs. Default 1m; negative disables
	// the cleaner in this client.
	Interval time.Duration
	// BatchSize bounds each DELETE. Default 1000.
	BatchSize int
}

// Stats counts what a client has done since it started.
type Stats struct {
	Claimed   int64 // attempts started
	Succeeded int64 // successes recorded
	Retried   int64 // failures sent back to the queue
	Dead      int64 // failures that ended the job
	Released  int64 // attempts returned to the queue by a shutdown
	// LeaseLost counts attempts that lost their lease, once each: found gone
	// by a heartbeat (rescued or cancelled), passed their local lease
	// deadline unrenewed, or refused by the fence when their outcome was
	// written.
	LeaseLost int64
	Rescued   int64 // expired leases ended by this client's rescuer
	Deleted   int64 // finished jobs deleted by this client's cleaner
}

// Client runs workers against the job table, and enqueues.
//
// A client that runs workers keeps its own bookkeeping (claims, heartbeats,
// the recording of outcomes) off the pool it is given: it opens small
// pools of its own with the same connection settings: one for claims,
// snoozes and the rest of its bookkeeping, of one connection plus one per
// queue, 16 at the most (application_name "relay-worker"; a client of
// more queues shares those between their claims), one of one connection
// for the heartbeat ("relay-heartbeat"), which nothing else uses, and one
// of one connection for the recording of outcomes ("relay-completer"): so
// that neither handlers holding every connection of the caller's pool (a
// transaction each, as CompleteTx asks) nor claims waiting on a lock can
// starve a heartbeat. Their connections wait at most a tenth of
// LeaseDuration (10ms at the least) for a lock, where the server accepts
// lock_timeout as a startup parameter (PgBouncer does not).
//
// Start probes the connections once: through a proxy that pools them per
// transaction (PgBouncer's pool_mode=transaction) a pool that caches
// prepared statements is refused (ErrStatementCache), and without a
// ListenerURL the client polls instead of listening, saying so once. See
// docs/deploy.md.
type Client struct {
	pool *pgxpool.Pool // the caller's: enqueues, rescues, cleanup
	own  *pgxpool.Pool // the client's bookkeeping: claims, snoozes (nil before Start)
	// beats is the heartbeat's pool, of one connection (nil before Start):
	// lease renewals only, so that no claim waiting on a lock holds the
	// connection a renewal needs.
	beats *pgxpool.Pool
	// outcomes is the completer's pool, of one connection (nil before
	// Start): the recording of outcomes.
	outcomes *pgxpool.Pool
	// listener is the LISTEN connection's settings (nil: the pool's).
	listener *pgx.ConnConfig
	cfg      Config
	logger   *slog.Logger
	workers  map[string]*registration
	queues   map[string]*queue

	inflight sync.Map // job id → *running
	// cancelNotes counts the cancel notifications heard (onNotify) and
	// the listener's connections: a job claimed by a statement of its
	// own and made a job in flight after its commit (adopt) checks for a
	// cancel of it when this moved meanwhile, since a notification heard
	// in between found nothing in flight to cancel.
	cancelNotes atomic.Uint64
	// snoozing holds the attempts whose snooze is being written (*running
	// → struct{}): their handlers returned, and the heartbeat renews them.
	snoozing  sync.Map
	completer *completer
	stats     counters
	metrics   *metrics
	tracer    trace.Tracer
	// attemptSpan is the options of every attempt's span, made once: a
	// variadic call would allocate them per job.
	attemptSpan []trace.SpanStartOption
	lifecycle   sync.Mutex
	started     bool
	stopped     bool
	loopCancel  context.CancelFunc      // stops claiming and maintenance
	workCancel  context.CancelCauseFunc // cancels running handlers (hard stop)
	workCtx     context.Context         // the handlers' parent (set by Start)
	// live is true from Start until Stop begins: an eager insert takes a
	// slot only then.
	live       atomic.Bool
	loops      sync.WaitGroup // producers, rescuer, cleaner
	background sync.WaitGroup // listener, heartbeats
	jobs       sync.WaitGroup // running handlers
	bgCancel   context.CancelFunc
	// hardCtx bounds every bookkeeping statement; it ends when Stop's
	// deadline passes, so that no statement outlives Stop.
	hardCtx    context.Context
	hardCancel context.CancelFunc
	// leaseBudget is how long after a lease was last renewed (counted from
	// when the renewing statement was sent, on the monotonic clock) the
	// handler is cancelled: LeaseDuration less its leaseMarginDivisor-th part.
	leaseBudget time.Duration
	epoch       time.Time // local lease deadlines count from here (monotonic)
	// handOffNow asks handOffLoop to take the hand-offs now (a 'keys' or 'wakes'
	// notification, a connect of the listener).
	handOffNow chan struct{}
	// proc is the client's entry in relay_processes (set by Start).
	proc *liveness.Process
	// peers is which queues other live processes serve (localwake.go).
	peers peerView
}

// leaseMarginDivisor sets the share of a lease (one part in this many)
// kept between the local lease deadline and the lease's expiry in the
// database: a handler cancelled at the local deadline has this long to
// return before any other worker can claim its job.
const leaseMarginDivisor = 5

type running struct {
	row *JobRow
	// attrs is the job's metric attributes (metrics.with), looked up once.
	attrs  metric.MeasurementOption
	ctx    context.Context // the handler's context, made at claim time
	cancel context.CancelCauseFunc
	// group watches the local lease deadline, with those of the other jobs
	// of its claim, and slot is r's place in it (see leaseGroup).
	group *leaseGroup
	slot  int
	// deadline is the local lease deadline, as time since the client's
	// epoch (monotonic): each renewal moves it; checked again when the
	// handler starts, since the group's timer fires asynchronously.
	deadline atomic.Int64
	// lost: the lease was found lost (or passed its local deadline) and the
	// handler cancelled; counted once.
	lost atomic.Bool
	// completedInTx: CompleteTx recorded the success in the handler's
	// transaction; the lease is no longer needed.
	completedInTx atomic.Bool
	// done: the handler returned (or will never run); the local lease
	// deadline is disarmed (endLease).
	done atomic.Bool
}

// loseLease cancels r's handler with ErrLeaseLost, once, and counts it. A
// job whose success CompleteTx has recorded is left alone: its lease ended
// with the success, and nothing can run it again.
func (c *Client) loseLease(r *running, why string) {
	if r.done.Load() || r.completedInTx.Load() || errors.Is(context.Cause(r.ctx), ErrJobCancelled) || !r.lost.CompareAndSwap(false, true) {
		return // over, done, cancelled (its lease ended with it), or counted already
	}
	c.stats.leaseLost.Add(1)
	c.metrics.leaseLost.Add(context.Background(), 1, c.metrics.with(r.row))
	c.logger.Warn("relay: lease lost while running; cancelling the handler", jobLogAttrs(r.row, "attempt", r.row.Attempt, "reason", why)...)
	r.cancel(ErrLeaseLost)
}

type counters struct {
	claimed, succeeded, retried, dead, released, leaseLost, rescued, deleted atomic.Int64
}

// NewClient returns a client on pool. It validates cfg but does not touch the
// database; call Start to run workers.
func NewClient(pool *pgxpool.Pool, cfg *Config) (*Client, error) {
	if pool == nil {
		return nil, errors.New("core: new client: nil pool")
	}
	c := &Client{pool: pool, queues: map[string]*queue{}, workers: map[string]*registration{}, epoch: time.Now(), handOffNow: make(chan struct{}, 1)}
	if cfg != nil {
		c.cfg = *cfg
	}
	cf := &c.cfg
	if err := cf.validate(); err != nil {
		return nil, err
	}
	cf.LeaseDuration = cmp.Or(cf.LeaseDuration, 30*time.Second)
	if cf.LeaseDuration < 100*time.Millisecond {
		return nil, fmt.Errorf("core: new client: LeaseDuration %s is below 100ms", cf.LeaseDuration)
	}
	cf.HeartbeatInterval = cmp.Or(cf.HeartbeatInterval, cf.LeaseDuration/3)
	c.leaseBudget = cf.LeaseDuration - cf.LeaseDuration/leaseMarginDivisor
	if 2*cf.HeartbeatInterval > c.leaseBudget {
		return nil, fmt.Errorf("core: new client: HeartbeatInterval %s must be at most 40%% of LeaseDuration %s (two renewals before the local lease deadline)",
			cf.HeartbeatInterval, cf.LeaseDuration)
	}
	cf.PollInterval = cmp.Or(cf.PollInterval, time.Second)
	cf.ClaimCoalesce = cmp.Or(cf.ClaimCoalesce, defaultClaimCoalesce)
	cf.EnqueueWakeCoalesce = cmp.Or(cf.EnqueueWakeCoalesce, jobinsert.DefaultWakeWindow)
	cf.FetchLimit = cmp.Or(cf.FetchLimit, 1000)
	cf.RescueInterval = cmp.Or(cf.RescueInterval, cf.LeaseDuration/2)
	cf.LivenessTimeout = cmp.Or(cf.LivenessTimeout, time.Minute)
	cf.Retention.Succeeded = cmp.Or(cf.Retention.Succeeded, 24*time.Hour)
	cf.Retention.Cancelled = cmp.Or(cf.Retention.Cancelled, 7*24*time.Hour)
	cf.Retention.Dead = cmp.Or(cf.Retention.Dead, 30*24*time.Hour)
	cf.Retention.Interval = cmp.Or(cf.Retention.Interval, time.Minute)
	cf.Retention.BatchSize = cmp.Or(cf.Retention.BatchSize, 1000)
	if cf.RetryPolicy == nil {
		cf.RetryPolicy = Backoff{}
	}
	c.logger = cmp.Or(cf.Logger, slog.Default())
	if cf.ID == "" {
		host, _ := os.Hostname()
		b := make([]byte, 3)
		rand.Read(b)
		cf.ID = host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b)
	}
	if cf.Workers != nil {
		c.workers = cf.Workers.byKind
		if len(cf.Queues) == 0 {
			cf.Queues = map[string]QueueConfig{DefaultQueue: {}}
		}
	}
	for name, qc := range cf.Queues { // validated above
		max := cmp.Or(qc.MaxWorkers, 10)
		c.queues[name] = &queue{client: c, name: name, spanName: "process " + name, max: max, prefetch: qc.Prefetch, wake: make(chan struct{}, 1)}
	}
	if len(c.queues) > 0 && cf.Workers == nil {
		return nil, errors.New("core: new client: Queues are set but Workers is nil")
	}
	c.tracer = tracer(c.cfg.TracerProvider)
	c.attemptSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	m, err := newMetrics(c)
	if err != nil {
		return nil, fmt.Errorf("core: new client: metrics: %w", err)
	}
	c.metrics = m
	for _, r := range c.workers {
		if r.attach != nil {
			r.attach(c, eagerInserter{c})
		}
	}
	return c, nil
}

// ID is the name this client writes into leases (attempted_by).
func (c *Client) ID() string { return c.cfg.ID }

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	s := &c.stats
	return Stats{
		Claimed: s.claimed.Load(), Succeeded: s.succeeded.Load(), Retried: s.retried.Load(),
		Dead: s.dead.Load(), Released: s.released.Load(), LeaseLost: s.leaseLost.Load(),
		Rescued: s.rescued.Load(), Deleted: s.deleted.Load(),
	}
}

// Start begins claiming and running jobs, and the background work (listener,
// heartbeats, rescuer, cleaner). It first asks the database whether its
// schema is current, and fails, starting nothing, when migrations are
// pending (an error matching migrations.ErrNotMigrated, naming the command
// that applies them) or the database cannot be reached; a role that may not
// read the migrations' bookkeeping table skips the check. It returns once
// that answer is in; ctx bounds nothing after that (use Stop). A client
// starts once.
func (c *Client) Start(ctx context.Context) error {
	c.lifecycle.Lock()
	defer c.lifecycle.Unlock()
	if c.started {
		return errors.New("core: start: client already started")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("core: start: %w", err)
	}
	if err := checkSchema(ctx, c.pool); err != nil {
		return fmt.Errorf("core: start: %w", err)
	}
	c.started = true

	bgCtx, bgCancel := context.WithCancel(context.WithoutCancel(ctx))
	loopCtx, loopCancel := context.WithCancel(bgCtx)
	workCtx, workCancel := context.WithCancelCause(context.WithoutCancel(ctx))
	c.bgCancel, c.loopCancel, c.workCancel, c.workCtx = bgCancel, loopCancel, workCancel, workCtx

	c.hardCtx, c.hardCancel = context.WithCancel(context.Background())
	c.own, c.beats, c.outcomes = c.pool, c.pool, c.pool
	// undo takes back what Start began when it fails before any loop runs:
	// the client stays unstarted, and may start again.
	undo := func(err error) error {
		if c.own != c.pool {
			c.closeOwnPools()
		}
		bgCancel()
		loopCancel()
		workCancel(nil)
		c.hardCancel()
		c.started = false
		return err
	}
	listen := false
	if len(c.queues) > 0 {
		var err error
		if listen, err = c.newOwnPools(ctx); err != nil {
			c.own, c.beats, c.outcomes = c.pool, c.pool, c.pool // it closed what it opened
			return undo(err)
		}
	}
	if err := c.register(ctx); err != nil {
		return undo(err)
	}
	c.background.Add(1)
	go func() { defer c.background.Done(); c.proc.Keep(bgCtx, c.logger) }()
	if len(c.queues) > 0 {
		// Read once now, so that the first enqueues already wake this
		// process's loops alone when no other process serves their queues.
		if err := c.refreshPeers(ctx); err != nil {
			c.logger.Debug("relay: could not read which queues other processes serve; enqueues notify them all", "error", err)
		}
		c.background.Add(1)
		go func() { defer c.background.Done(); c.peersLoop(bgCtx) }()
	}

	c.completer = newCompleter(c)
	go c.completer.run()

	c.background.Add(1)
	go func() { defer c.background.Done(); c.checkAutovacuum(bgCtx) }()

	if listen {
		c.background.Add(1)
		go func() {
			defer c.background.Done()
			notifier.Run(bgCtx, notifier.Config{
				Pool:       c.pool,
				ConnConfig: c.listener,
				Channels:   []string{"relay_jobs", "relay_control"},
				OnNotify:   c.onNotify,
				OnConnect:  func() { c.wakeAll(); c.cancelNotes.Add(1); c.cancelMissed(bgCtx); c.handOffSoon() },
				Logger:     c.logger,
				AppName:    appname.For(c.pool.Config().ConnConfig.RuntimeParams["application_name"], "listener", c.cfg.ID),
			})
		}()
	}
	if len(c.queues) > 0 {
		for _, q := range c.queues {
			c.loops.Add(1)
			go func() { defer c.loops.Done(); q.run(loopCtx, workCtx) }()
			if !c.cfg.NoClaimFloor {
				c.loops.Add(1)
				go func() { defer c.loops.Done(); q.keepFloor(loopCtx) }()
			}
		}
		c.loops.Add(1)
		go func() { defer c.loops.Done(); c.handOffLoop(loopCtx) }()
		// Heartbeats go on while a stopping client drains its jobs.
		c.background.Add(1)
		go func() { defer c.background.Done(); c.heartbeatLoop(bgCtx) }()
	}
	if c.cfg.RescueInterval > 0 {
		c.loops.Add(1)
		go func() {
			defer c.loops.Done()
			c.every(loopCtx, c.cfg.RescueInterval, c.rescue)
		}()
	}
	if c.cfg.Retention.Interval > 0 {
		c.loops.Add(1)
		go func() { defer c.loops.Done(); c.every(loopCtx, c.cfg.Retention.Interval, c.cleanup) }()
	}
	c.live.Store(true)
	return nil
}

// Stop shuts the client down gracefully: it stops claiming at once (jobs
// claimed ahead, waiting for a worker, are returned to the queue without
// running), lets the running jobs finish until shortly before ctx's
// deadline, then cancels those still running (their context's cause is
// ErrShutdown) and returns their jobs to the queue, without counting the
// interrupted attempt. Outcomes are recorded before Stop returns.
//
// Stop returns by ctx's deadline (or soon after ctx is cancelled), even
// with the database unreachable: the last quarter of the time left, up to
// 2s, is kept for recording outcomes. It returns nil when every job
// finished and was recorded, else a *StopError saying what was interrupted
// and what could not be recorded (those jobs run again once their leases
// expire).
func (c *Client) Stop(ctx context.Context) error {
	c.lifecycle.Lock()
	defer c.lifecycle.Unlock()
	// Wake-ups the client's enqueues left scheduled go before it returns,
	// whether or not it works queues (an insert-only client is never
	// started); for a working client, after its handlers' enqueues.
	defer c.flushWakeups(ctx)
	if !c.started || c.stopped {
		return nil
	}
	c.stopped = true
	c.live.Store(false) // no eager job takes a slot from here (eager.go)
	drainCtx := ctx
	if dl, ok := ctx.Deadline(); ok {
		reserve := min(time.Until(dl)/4, 2*time.Second)
		var cancel context.CancelFunc
		drainCtx, cancel = context.WithDeadline(ctx, dl.Add(-reserve))
		defer cancel()
	}
	// Stop claiming. A claim under way completes and its jobs start, so none
	// is left claimed without a handler; after this no job starts. A claim
	// that cannot reach the database is abandoned at the drain deadline.
	c.loopCancel()
	loopsDone := waitGroup(drainCtx, &c.loops)
	if !loopsDone {
		c.hardCancel()
		loopsDone = waitGroup(ctx, &c.loops)
	}
	for _, q := range c.queues {
		q.close()
	}

	drained := make(chan struct{})
	go func() { c.jobs.Wait(); close(drained) }()
	var err StopError
	select {
	case <-drained:
	case <-drainCtx.Done():
		c.inflight.Range(func(_, v any) bool { err.Interrupted++; return true })
		c.logger.Warn("relay: stop deadline reached; cancelling running jobs", "running", err.Interrupted)
		c.workCancel(ErrShutdown)
		// Handlers that honour their context return promptly and release
		// their own jobs; release for those that do not.
		wait, cancel := context.WithTimeout(ctx, max(time.Until(deadlineOr(ctx, time.Now()))/2, 0))
		select {
		case <-drained:
		case <-wait.Done():
			c.releaseAll()
		}
		cancel()
	}
	err.Unrecorded = c.completer.stop(ctx)
	c.metrics.close()
	c.bgCancel()
	c.unregister(ctx)
	c.hardCancel()
	c.workCancel(ErrShutdown)
	if c.own != c.pool {
		if waitGroup(ctx, &c.background) && loopsDone {
			c.closeOwnPools() // every user of the pools has returned: Close does not wait
		} else {
			go func() { c.background.Wait(); c.loops.Wait(); c.closeOwnPools() }()
		}
	}
	if err.Interrupted > 0 || err.Unrecorded > 0 {
		if err.Unrecorded > 0 {
			c.logger.Error("relay: stop: outcomes not recorded; those jobs run again once their leases expire", "jobs", err.Unrecorded)
		}
		return &err
	}
	return nil
}

// StopError is what Stop could not finish by its deadline.
type StopError struct {
	// Interrupted counts the jobs still running at the deadline: their
	// handlers were cancelled and the jobs returned to the queue.
	Interrupted int
	// Unrecorded counts the attempts whose outcome (success, failure or
	// return to the queue) could not be written, the database being
	// unreachable or their rows locked: those jobs run again once their
	// leases expire.
	Unrecorded int
}

func (e *StopError) Error() string {
	return fmt.Sprintf("core: stop: %d running jobs interrupted and returned to the queue; %d outcomes not recorded (those jobs run again once their leases expire)",
		e.Interrupted, e.Unrecorded)
}

// waitGroup waits for wg until ctx is done, and says whether wg finished.
func waitGroup(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// deadlineOr is ctx's deadline, or def when it has none.
func deadlineOr(ctx context.Context, def time.Time) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return def
}

func (c *Client) onNotify(channel, payload string) {
	switch channel {
	case "relay_jobs":
		if q, ok := c.queues[payload]; ok {
			q.rescan.Store(true)
			q.notify()
		}
	case "relay_control":
		// cancel:<id>:<lease token>; the token is empty for a job that was
		// queued, and missing from an older client's notification.
		if rest, ok := strings.CutPrefix(payload, "cancel:"); ok {
			idText, token, _ := strings.Cut(rest, ":")
			id, err := strconv.ParseInt(idText, 10, 64)
			if err != nil {
				return
			}
			c.cancelNotes.Add(1) // before the look-up: see adopt
			if v, ok := c.inflight.Load(id); ok {
				r := v.(*running)
				if token != "" && token != r.row.LeaseToken.String() {
					return // a notification about an earlier attempt
				}
				r.cancel(ErrJobCancelled)
			}
		} else if payload == "keys" || payload == "wakes" {
			c.handOffSoon()
		}
	}
}

// cancelMissed cancels, with ErrJobCancelled, the running jobs cancelled
// while the listener was not listening (before its first LISTEN, or while it
// reconnected): their notification was sent to nobody. Without it such a
// handler would run until its next heartbeat found the lease gone, and
// stop with ErrLeaseLost instead of its real cause. One bounded query per
// connection of the listener.
func (c *Client) cancelMissed(ctx context.Context) {
	var ids []int64
	c.inflight.Range(func(k, _ any) bool { ids = append(ids, k.(int64)); return true })
	c.cancelCancelled(ctx, ids)
}

// cancelCancelled cancels, with ErrJobCancelled, those of the running jobs
// ids that are cancelled in the database (cancelMissed, adopt).
func (c *Client) cancelCancelled(ctx context.Context, ids []int64) {
	if len(ids) == 0 {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, c.leaseBudget/2)
	defer cancel()
	rows, err := c.own.Query(qctx, sqlCancelledAmong, ids)
	if err != nil {
		if ctx.Err() == nil {
			c.logger.Warn("relay: check for cancellations missed while not listening failed", "error", err)
		}
		return
	}
	cancelled, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return
	}
	for _, id := range cancelled {
		if v, ok := c.inflight.Load(id); ok {
			v.(*running).cancel(ErrJobCancelled)
		}
	}
}

func (c *Client) wakeAll() {
	for _, q := range c.queues {
		q.rescan.Store(true)
		q.notify()
	}
}

// every runs f now and then every d until ctx is done.
func (c *Client) every(ctx context.Context, d time.Duration, f func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		f(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// dbCtx bounds a bookkeeping statement that must not depend on a handler's
// context (which may be cancelled); Stop ends it at its deadline.
func (c *Client) dbCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.hardCtx, 15*time.Second)
}

// maxClaimConns bounds the bookkeeping pool's connections for claims: a
// queue's claim holds one for a single statement (a limited claim for one
// transaction, its lock waits bounded by lock_timeout), so a client of
// many queues shares this many between them rather than open one per
// queue, which with hundreds of queues exceeded the server's
// max_connections and left every claim failing.
const maxClaimConns = 16

// newOwnPools opens the client's bookkeeping pools (see Client) on the
// caller's pool's settings: one of a connection for snoozes and the rest
// and one per queue's claim (at most maxClaimConns), the heartbeat's of one
// connection, and the completer's of one connection for the recording of
// outcomes. Their connections refuse to wait more than a short
// while for a row lock (they use SKIP LOCKED; this is the backstop) where
// the server accepts lock_timeout as a startup parameter, and name
// themselves (appname.For). It probes the connections first (checkPooling) and
// says whether to listen.
func (c *Client) newOwnPools(ctx context.Context) (listen bool, err error) {
	cfg := c.pool.Config()
	cfg.MaxConns = int32(1 + min(len(c.queues), maxClaimConns))
	cfg.MinConns = 0
	rp := cfg.ConnConfig.RuntimeParams
	if rp == nil {
		rp = map[string]string{}
		cfg.ConnConfig.RuntimeParams = rp
	}
	user := rp["application_name"]
	rp["lock_timeout"] = strconv.FormatInt(max(c.cfg.LeaseDuration/10, 10*time.Millisecond).Milliseconds(), 10)
	rp["application_name"] = appname.For(user, "worker", c.cfg.ID)
	if c.cfg.ListenerURL != "" {
		if c.listener, err = pgx.ParseConfig(c.cfg.ListenerURL); err != nil {
			return false, fmt.Errorf("core: start: Config.ListenerURL: %w", err)
		}
	}
	if listen, err = c.checkPooling(ctx, cfg.ConnConfig); err != nil {
		return false, err
	}
	out := cfg.Copy()
	out.MaxConns = 1
	out.ConnConfig.RuntimeParams["application_name"] = appname.For(user, "completer", c.cfg.ID)
	// The heartbeat's connection is opened now and kept: one opened only
	// when a renewal is due could be refused then (max_connections).
	beats := cfg.Copy()
	beats.MaxConns, beats.MinConns = 1, 1
	beats.ConnConfig.RuntimeParams["application_name"] = appname.For(user, "heartbeat", c.cfg.ID)
	if c.own, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
		return false, fmt.Errorf("core: start: open the client's bookkeeping pool: %w", err)
	}
	if c.beats, err = pgxpool.NewWithConfig(context.Background(), beats); err != nil {
		c.own.Close()
		return false, fmt.Errorf("core: start: open the client's heartbeat pool: %w", err)
	}
	if c.outcomes, err = pgxpool.NewWithConfig(context.Background(), out); err != nil {
		c.own.Close()
		c.beats.Close()
		return false, fmt.Errorf("core: start: open the client's completer pool: %w", err)
	}
	return listen, nil
}

// closeOwnPools closes the pools newOwnPools opened.
func (c *Client) closeOwnPools() {
	c.own.Close()
	c.beats.Close()
	c.outcomes.Close()
}
