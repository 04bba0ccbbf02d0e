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

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

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
	// Default LeaseDuration/3.
	HeartbeatInterval time.Duration
	// PollInterval is the fallback fetch period when no notification comes.
	// Default 1s.
	PollInterval time.Duration
	// FetchLimit caps the jobs one claim statement takes (a claim takes no
	// more than the free workers either). Large batches are cheaper per job:
	// a burn-down with 2,000 workers drains about 40% faster at 1,000 than at
	// 100 (docs/benchmarks.md). Default 1000.
	FetchLimit int
	// RescueInterval is how often expired leases are looked for. Default
	// LeaseDuration/2. Negative disables the rescuer in this client.
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
}

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
	// LeaseLost counts attempts whose lease was gone when they tried to
	// write (or heartbeat): the write was refused by the fence.
	LeaseLost int64
	Rescued   int64 // expired leases ended by this client's rescuer
	Deleted   int64 // finished jobs deleted by this client's cleaner
}

// Client runs workers against the job table, and enqueues.
type Client struct {
	pool    *pgxpool.Pool
	cfg     Config
	logger  *slog.Logger
	workers map[string]*registration
	queues  map[string]*queue

	inflight   sync.Map // job id → *running
	completer  *completer
	stats      counters
	metrics    *metrics
	tracer     trace.Tracer
	lifecycle  sync.Mutex
	started    bool
	stopped    bool
	loopCancel context.CancelFunc      // stops claiming and maintenance
	workCancel context.CancelCauseFunc // cancels running handlers (hard stop)
	loops      sync.WaitGroup          // producers, rescuer, cleaner
	background sync.WaitGroup          // listener, heartbeats
	jobs       sync.WaitGroup          // running handlers
	bgCancel   context.CancelFunc
}

type running struct {
	row    *JobRow
	ctx    context.Context // the handler's context, made at claim time
	cancel context.CancelCauseFunc
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
	c := &Client{pool: pool, queues: map[string]*queue{}, workers: map[string]*registration{}}
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
	if cf.HeartbeatInterval >= cf.LeaseDuration {
		return nil, fmt.Errorf("core: new client: HeartbeatInterval %s must be shorter than LeaseDuration %s", cf.HeartbeatInterval, cf.LeaseDuration)
	}
	cf.PollInterval = cmp.Or(cf.PollInterval, time.Second)
	cf.FetchLimit = cmp.Or(cf.FetchLimit, 1000)
	cf.RescueInterval = cmp.Or(cf.RescueInterval, cf.LeaseDuration/2)
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
	for name, qc := range cf.Queues {
		if name == "" || len(name) > 128 {
			return nil, fmt.Errorf("core: new client: queue name %q must be 1 to 128 bytes", name)
		}
		if qc.MaxWorkers < 0 {
			return nil, fmt.Errorf("core: new client: queue %q: MaxWorkers %d is negative", name, qc.MaxWorkers)
		}
		if qc.Prefetch < 0 {
			return nil, fmt.Errorf("core: queue %q: Prefetch %d is negative", name, qc.Prefetch)
		}
		max := cmp.Or(qc.MaxWorkers, 10)
		c.queues[name] = &queue{client: c, name: name, max: max, prefetch: qc.Prefetch, wake: make(chan struct{}, 1)}
	}
	if len(c.queues) > 0 && cf.Workers == nil {
		return nil, errors.New("core: new client: Queues are set but Workers is nil")
	}
	c.tracer = tracer(c.cfg.TracerProvider)
	m, err := newMetrics(c)
	if err != nil {
		return nil, fmt.Errorf("core: new client: metrics: %w", err)
	}
	c.metrics = m
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
// heartbeats, rescuer, cleaner). It returns at once; ctx bounds nothing after
// that (use Stop). A client starts once.
func (c *Client) Start(ctx context.Context) error {
	c.lifecycle.Lock()
	defer c.lifecycle.Unlock()
	if c.started {
		return errors.New("core: start: client already started")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("core: start: %w", err)
	}
	c.started = true

	bgCtx, bgCancel := context.WithCancel(context.WithoutCancel(ctx))
	loopCtx, loopCancel := context.WithCancel(bgCtx)
	workCtx, workCancel := context.WithCancelCause(context.WithoutCancel(ctx))
	c.bgCancel, c.loopCancel, c.workCancel = bgCancel, loopCancel, workCancel

	c.completer = newCompleter(c)
	go c.completer.run()

	c.background.Add(1)
	go func() { defer c.background.Done(); c.checkAutovacuum(bgCtx) }()

	if len(c.queues) > 0 {
		c.background.Add(1)
		go func() {
			defer c.background.Done()
			notifier.Run(bgCtx, notifier.Config{
				Pool:      c.pool,
				Channels:  []string{"relay_jobs", "relay_control"},
				OnNotify:  c.onNotify,
				OnConnect: c.wakeAll,
				Logger:    c.logger,
				AppName:   "relay-listener " + c.cfg.ID,
			})
		}()
		for _, q := range c.queues {
			c.loops.Add(1)
			go func() { defer c.loops.Done(); q.run(loopCtx, workCtx) }()
		}
		// Heartbeats go on while a stopping client drains its jobs.
		c.background.Add(1)
		go func() { defer c.background.Done(); c.heartbeatLoop(bgCtx) }()
	}
	if c.cfg.RescueInterval > 0 {
		c.loops.Add(1)
		go func() { defer c.loops.Done(); c.every(loopCtx, c.cfg.RescueInterval, c.rescue) }()
	}
	if c.cfg.Retention.Interval > 0 {
		c.loops.Add(1)
		go func() { defer c.loops.Done(); c.every(loopCtx, c.cfg.Retention.Interval, c.cleanup) }()
	}
	return nil
}

// Stop shuts the client down gracefully: it stops claiming at once, lets the
// running jobs finish until ctx is done, then cancels those still running
// (their context's cause is ErrShutdown) and returns their jobs to the queue
// immediately, without counting the interrupted attempt. Successes are
// recorded before Stop returns. It returns an error naming how many jobs were
// interrupted, or nil when all finished.
func (c *Client) Stop(ctx context.Context) error {
	c.lifecycle.Lock()
	defer c.lifecycle.Unlock()
	if !c.started || c.stopped {
		return nil
	}
	c.stopped = true
	// Stop claiming. A claim under way completes and its jobs start, so none
	// is left claimed without a handler; after this no job starts.
	c.loopCancel()
	c.loops.Wait()
	for _, q := range c.queues {
		q.close()
	}

	drained := make(chan struct{})
	go func() { c.jobs.Wait(); close(drained) }()
	var interrupted int
	select {
	case <-drained:
	case <-ctx.Done():
		c.inflight.Range(func(_, v any) bool { interrupted++; return true })
		c.logger.Warn("relay: stop deadline reached; cancelling running jobs", "running", interrupted)
		c.workCancel(ErrShutdown)
		// Handlers that honour their context return promptly and release
		// their own jobs; release for those that do not.
		select {
		case <-drained:
		case <-time.After(2 * time.Second):
			c.releaseAll()
		}
	}
	c.completer.stop()
	c.metrics.close()
	c.bgCancel()
	c.background.Wait()
	c.workCancel(ErrShutdown)
	if interrupted > 0 {
		return fmt.Errorf("core: stop: %d running jobs interrupted and returned to the queue", interrupted)
	}
	return nil
}

func (c *Client) onNotify(channel, payload string) {
	switch channel {
	case "relay_jobs":
		if q, ok := c.queues[payload]; ok {
			q.rescan.Store(true)
			q.notify()
		}
	case "relay_control":
		if idText, ok := strings.CutPrefix(payload, "cancel:"); ok {
			id, err := strconv.ParseInt(idText, 10, 64)
			if err != nil {
				return
			}
			if v, ok := c.inflight.Load(id); ok {
				v.(*running).cancel(ErrJobCancelled)
			}
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
// context (which may be cancelled).
func dbCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 15*time.Second)
}
