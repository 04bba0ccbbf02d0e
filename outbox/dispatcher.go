package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/appname"
	"github.com/relayq/relay/internal/background"
	"github.com/relayq/relay/internal/liveness"
	"github.com/relayq/relay/internal/notifier"
)

// Subscription maps a topic to a job kind: every event of the topic becomes
// one job of the kind (several subscriptions to a topic fan out).
type Subscription struct {
	// Topic to follow, matched exactly.
	Topic string
	// Kind of the job each event becomes; its worker's args type embeds
	// Delivery. With Endpoint set it defaults to WebhookKind.
	Kind string
	// Endpoint, when set, makes this a webhook subscription: each event is
	// POSTed, signed, to the endpoint of that name (see WebhookWorker).
	Endpoint string
	// Opts for each job: queue, priority, max attempts, metadata. RunAt,
	// Delay, Unique and OrderingKey are set by the dispatcher (the ordering
	// key is the kind and the event's key) and must be unset.
	Opts *core.EnqueueOpts
}

// Config configures a Dispatcher. Subscriptions is needed; the zero value
// of every other field is a sensible default.
type Config struct {
	// Subscriptions are this process's declarations. They are stored in
	// the database, and every dispatcher fans out to every stored
	// subscription that is not retired — whichever process declared it — so
	// processes of different versions agree. A subscription is retired only
	// when no live dispatcher of its Namespace declares it. An event gets
	// the subscriptions active when it is dispatched: one published before
	// a subscription existed gets it only if not yet dispatched then.
	Subscriptions []Subscription
	// Namespace owns the subscriptions: one per service sharing the
	// database. Default "default".
	Namespace string
	// LivenessTimeout is how long a dispatcher's declarations keep its
	// subscriptions after its last heartbeat (four per timeout while it
	// runs; Stop ends them at once). It is stored with the process: every
	// dispatcher judges this one by it. At least 1s; default 1m.
	LivenessTimeout time.Duration
	// BatchSize caps the events moved per transaction. Default 500.
	BatchSize int
	// PollInterval is the fallback when no notification comes. Default 1s.
	PollInterval time.Duration
	// Retention is how long dispatched events are kept (their jobs live
	// on in relay_jobs). Default 7 days; negative keeps them forever.
	Retention time.Duration
	// Logger receives the dispatcher's logs. Default slog.Default().
	Logger *slog.Logger
	// TracerProvider makes the "dispatch <topic>" span of each event: a
	// child of the publisher's span when Publish ran under one, a new root
	// otherwise. Each of the event's jobs stores that span's context, so its
	// attempts are children of it (or linked to it, per the worker client's
	// core.TraceMode) and unrelated events never share a trace. Default: the
	// global provider.
	TracerProvider trace.TracerProvider
}

// Dispatcher moves committed events into jobs. Run one in as many processes
// as you like: one at a time holds the dispatch lock, the others stand by.
type Dispatcher struct {
	pool *pgxpool.Pool
	cfg  Config
	proc *liveness.Process // this process's entry, declaring the subscriptions
	wake chan struct{}
	// appName names the session while a batch is dispatched (appname.For),
	// made at the first dispatch.
	appName     string
	appNameOnce sync.Once

	declareMu sync.Mutex
	declared  bool

	warnMu sync.Mutex
	warned map[string]bool // stored subscription values already logged as unusable

	runner background.Runner // Start and Stop
}

// NewDispatcher validates the subscriptions.
func NewDispatcher(pool *pgxpool.Pool, cfg *Config) (*Dispatcher, error) {
	if pool == nil {
		return nil, errors.New("outbox: nil pool")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Retention == 0 {
		c.Retention = 7 * 24 * time.Hour
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Namespace == "" {
		c.Namespace = "default"
	}
	if c.LivenessTimeout <= 0 {
		c.LivenessTimeout = time.Minute
	}
	d := &Dispatcher{pool: pool, wake: make(chan struct{}, 1)}
	subs := c.Subscriptions
	c.Subscriptions = nil
	seen := map[[2]string]bool{}
	for _, s := range subs {
		if s.Endpoint != "" && s.Kind == "" {
			s.Kind = WebhookKind
		}
		if s.Topic == "" || s.Kind == "" {
			return nil, fmt.Errorf("outbox: subscription %+v: Topic and Kind are required", s)
		}
		if s.Opts != nil && (!s.Opts.RunAt.IsZero() || s.Opts.Delay != 0 || s.Opts.Unique != nil || s.Opts.OrderingKey != "") {
			return nil, fmt.Errorf("outbox: subscription %s → %s: Opts.RunAt, Delay, Unique and OrderingKey must be unset", s.Topic, s.Kind)
		}
		if err := validateSubscription(s); err != nil {
			return nil, err
		}
		id := [2]string{s.Topic, s.Kind + "|" + s.Endpoint}
		if seen[id] {
			return nil, fmt.Errorf("outbox: subscription %s → %s %s declared twice", s.Topic, s.Kind, s.Endpoint)
		}
		seen[id] = true
		c.Subscriptions = append(c.Subscriptions, s)
	}
	d.cfg = c
	ids := make([]string, 0, len(c.Subscriptions))
	for _, s := range c.Subscriptions {
		ids = append(ids, subscriptionID(s))
	}
	proc, err := liveness.New(pool, liveness.Entry{Role: liveness.RoleDispatcher, Namespace: c.Namespace,
		Declares: ids, Timeout: c.LivenessTimeout})
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	d.proc = proc
	return d, nil
}

// validateSubscription refuses, at construction, what the core would refuse
// at every dispatch: subscriptions are stored and read by every
// dispatcher, so one that cannot be enqueued would stop the dispatch of
// every event, in every process, until it is retired.
func validateSubscription(s Subscription) error {
	var o core.EnqueueOpts
	if s.Opts != nil {
		o = *s.Opts
	}
	var reason string
	switch {
	case len(s.Kind) > 255 || !utf8.ValidString(s.Kind):
		reason = "Kind must be valid UTF-8, at most 255 bytes"
	case len(o.Queue) > 128 || !utf8.ValidString(o.Queue):
		reason = "Opts.Queue must be valid UTF-8, at most 128 bytes"
	case o.Priority != nil && (*o.Priority < 0 || *o.Priority > core.MaxPriority):
		reason = fmt.Sprintf("Opts.Priority %d is outside 0..%d", *o.Priority, core.MaxPriority)
	case o.MaxAttempts < 0:
		reason = fmt.Sprintf("Opts.MaxAttempts %d is negative", o.MaxAttempts)
	}
	if reason == "" && len(o.Metadata) > 0 {
		if _, err := json.Marshal(o.Metadata); err != nil {
			reason = "Opts.Metadata does not encode: " + err.Error()
		}
	}
	if reason != "" {
		return fmt.Errorf("outbox: subscription %s → %s: %s", s.Topic, s.Kind, reason)
	}
	return nil
}

// Start declares the subscriptions, then dispatches in the background until
// Stop: at once, on every notification of a published event, and every
// PollInterval.
func (d *Dispatcher) Start(ctx context.Context) error {
	if err := d.Declare(ctx); err != nil {
		return err
	}
	listen := func(ctx context.Context) {
		notifier.Run(ctx, notifier.Config{
			Pool: d.pool, Channels: []string{"relay_outbox"}, Logger: d.cfg.Logger, AppName: "relay-outbox",
			OnNotify:  func(string, string) { d.poke() },
			OnConnect: d.poke,
		})
	}
	return d.runner.Start(ctx, "outbox", listen, d.run, d.heartbeat)
}

// Stop stops dispatching; a batch under way commits or rolls back whole.
// This process's declarations end: the live dispatchers retire what only it
// declared at their next heartbeat.
func (d *Dispatcher) Stop(ctx context.Context) error {
	err := d.runner.Stop(ctx, "outbox")
	d.declareMu.Lock()
	declared := d.declared
	d.declareMu.Unlock()
	if declared {
		// Bounded even once ctx has ended (Unregister): an unresponsive
		// database cannot hold Stop for ever.
		if uerr := d.proc.Unregister(ctx); uerr != nil {
			err = errors.Join(err, fmt.Errorf("outbox: %w", uerr))
		}
	}
	return err
}

func (d *Dispatcher) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *Dispatcher) run(ctx context.Context) {
	tick := time.NewTicker(d.cfg.PollInterval)
	defer tick.Stop()
	failures := 0
	var lastCleanup time.Time
	for {
		if d.cfg.Retention > 0 && time.Since(lastCleanup) > time.Hour {
			lastCleanup = time.Now()
			for {
				n, err := DeleteDispatched(ctx, d.pool, d.cfg.Retention, 1000)
				if err != nil || n < 1000 {
					break
				}
			}
		}
		n, err := d.DispatchOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures++
			d.cfg.Logger.Warn("relay: outbox dispatch failed", "err", err)
		case n == d.cfg.BatchSize:
			failures = 0
			continue // more are waiting
		default:
			failures = 0
		}
		wait := time.Duration(0)
		if failures > 0 {
			wait = min(time.Duration(failures)*100*time.Millisecond, 5*time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-tick.C:
		}
	}
}

// DispatchOnce moves up to BatchSize events into jobs in one transaction
// and returns how many it handled (0 also when another dispatcher holds the
// dispatch lock). An event with a stored value that does not decode (headers
// that are not an object of strings, an infinite published_at, written
// behind Publish) is set aside
// in the same transaction instead: marked failed with its error (the admin
// API lists it), logged once with its id, and counted as handled; the
// events around it are dispatched. A stored trace context that does not
// decode costs its event only its parent span.
func (d *Dispatcher) DispatchOnce(ctx context.Context) (int, error) {
	if err := d.ensureDeclared(ctx); err != nil {
		return 0, err
	}
	moved := 0
	var marked []pendingNote // logged once their marks committed
	var spans []trace.Span
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, sqlDispatchLock).Scan(&locked); err != nil {
			return fmt.Errorf("take the dispatch lock: %w", err)
		}
		if !locked {
			return nil
		}
		// Named for the rest of the transaction only: an operator finds a
		// dispatch in pg_stat_activity as relay-dispatcher.
		d.appNameOnce.Do(func() {
			d.appName = appname.For(d.pool.Config().ConnConfig.RuntimeParams["application_name"], "dispatcher", "")
		})
		if _, err := tx.Exec(ctx, sqlNameSession, d.appName); err != nil {
			return fmt.Errorf("name the session: %w", err)
		}
		rows, err := tx.Query(ctx, sqlPending, d.cfg.BatchSize)
		if err != nil {
			return fmt.Errorf("read pending events: %w", err)
		}
		var traces []propagation.MapCarrier
		var events []Delivery
		var notes []pendingNote // events set aside or dispatched without a part
		for rows.Next() {
			var e Delivery
			var headers, tc []byte
			var published pgtype.Timestamptz
			if err := rows.Scan(&e.EventID, &e.Topic, &e.Key, &e.Payload, &headers, &published, &tc); err != nil {
				rows.Close()
				return fmt.Errorf("read pending events: %w", err)
			}
			e.PublishedAt = published.Time
			// A stored value of another shape (written behind Publish, or
			// by another version) fails its own event, never the dispatch:
			// an error here would stop every event behind this one for
			// good. The event is marked in this transaction, so it is read
			// and logged once.
			if err := json.Unmarshal(headers, &e.Headers); err != nil {
				notes = append(notes, pendingNote{id: e.EventID, topic: e.Topic, failed: true,
					err: fmt.Sprintf("decode headers (want an object of strings): %v", err)})
				continue
			}
			if published.InfinityModifier != pgtype.Finite {
				notes = append(notes, pendingNote{id: e.EventID, topic: e.Topic, failed: true,
					err: "published_at is not a finite time"})
				continue
			}
			// A trace context Publish did not write costs the event its
			// parent only: it is dispatched as a new trace.
			carrier := propagation.MapCarrier{}
			if err := json.Unmarshal(tc, &carrier); err != nil {
				carrier = propagation.MapCarrier{}
				notes = append(notes, pendingNote{id: e.EventID, topic: e.Topic,
					err: fmt.Sprintf("decode trace context (want an object of strings; dispatched as a new trace): %v", err)})
			}
			traces = append(traces, carrier)
			events = append(events, e)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read pending events: %w", err)
		}
		if len(notes) > 0 {
			ids := make([]int64, len(notes))
			failed := make([]bool, len(notes))
			msgs := make([]string, len(notes))
			for i, n := range notes {
				ids[i], failed[i], msgs[i] = n.id, n.failed, n.err
			}
			if _, err := tx.Exec(ctx, sqlMarkUndecodable, ids, failed, msgs); err != nil {
				return fmt.Errorf("mark undecodable events: %w", err)
			}
			for _, n := range notes {
				if n.failed {
					moved++
				}
			}
			marked = notes
		}
		if len(events) == 0 {
			return nil
		}
		byTopic, err := d.activeSubscriptions(ctx, tx)
		if err != nil {
			return fmt.Errorf("read subscriptions: %w", err)
		}
		ids := make([]int64, len(events))
		counts := make([]int32, len(events))
		var params []core.EnqueueParams
		tracer := d.cfg.TracerProvider.Tracer(instrumentationName)
		for i, e := range events {
			ids[i] = e.EventID
			meta, span := d.startDispatchSpan(ctx, tracer, e, traces[i])
			spans = append(spans, span)
			body, err := json.Marshal(e)
			if err != nil {
				return fmt.Errorf("encode event %d: %w", e.EventID, err)
			}
			for _, s := range byTopic[e.Topic] {
				body := body
				if s.Endpoint != "" {
					if body, err = json.Marshal(WebhookArgs{Delivery: e, Endpoint: s.Endpoint}); err != nil {
						return fmt.Errorf("encode event %d: %w", e.EventID, err)
					}
				}
				opts := core.EnqueueOpts{}
				if s.Opts != nil {
					opts = *s.Opts
				}
				if meta != nil {
					// The event's trace, not the dispatch batch's: core keeps
					// a traceparent the caller set.
					m := make(map[string]any, len(opts.Metadata)+len(meta))
					for k, v := range opts.Metadata {
						m[k] = v
					}
					for k, v := range meta {
						m[k] = v
					}
					opts.Metadata = m
				}
				if e.Key != "" {
					opts.OrderingKey = s.Kind + "|" + s.Endpoint + "|" + e.Key
				}
				params = append(params, core.EnqueueParams{Args: rawArgs{kind: s.Kind, body: body}, Opts: &opts})
				counts[i]++
			}
		}
		if len(params) > 0 {
			if _, err := core.EnqueueMany(ctx, tx, params); err != nil {
				return fmt.Errorf("enqueue: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, sqlMarkDispatched, ids, counts); err != nil {
			return fmt.Errorf("mark dispatched: %w", err)
		}
		moved += len(events)
		return nil
	})
	for _, span := range spans {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: dispatch: %w", err)
	}
	for _, n := range marked {
		if n.failed {
			d.cfg.Logger.Error("relay: outbox event set aside: a stored value does not decode; the others go on",
				"event_id", n.id, "topic", n.topic, "err", n.err)
		} else {
			d.cfg.Logger.Warn("relay: outbox event dispatched without a stored value that does not decode",
				"event_id", n.id, "topic", n.topic, "err", n.err)
		}
	}
	return moved, nil
}

// pendingNote is a pending event with a stored value that did not decode:
// failed (set aside, no jobs) or dispatched without it.
type pendingNote struct {
	id     int64
	topic  string
	failed bool
	err    string
}

// instrumentationName names the outbox's tracer.
const instrumentationName = "github.com/relayq/relay/outbox"

// startDispatchSpan starts the span of one event's dispatch — under the
// publisher's stored context, or as a new root — and returns the trace
// context its jobs store (nil when there is none to store).
func (d *Dispatcher) startDispatchSpan(ctx context.Context, tracer trace.Tracer, e Delivery, stored propagation.MapCarrier) (map[string]any, trace.Span) {
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", "relay"),
			attribute.String("messaging.operation.type", "create"),
			attribute.String("messaging.destination.name", e.Topic),
			attribute.Int64("relay.outbox.event_id", e.EventID),
		),
	}
	parent := trace.SpanContextFromContext(traceContext.Extract(context.Background(), stored))
	if parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	ctx, span := tracer.Start(ctx, "dispatch "+e.Topic, opts...)
	if !span.SpanContext().IsValid() {
		return nil, span
	}
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	meta := make(map[string]any, len(carrier))
	for k, v := range carrier {
		meta[k] = v
	}
	return meta, span
}

// DeleteDispatched deletes up to limit events dispatched more than
// olderThan ago and returns how many; call it until that is below limit.
// A running Dispatcher does this hourly (Config.Retention).
func DeleteDispatched(ctx context.Context, pool *pgxpool.Pool, olderThan time.Duration, limit int) (int64, error) {
	tag, err := pool.Exec(ctx, sqlDeleteDispatched, olderThan.Seconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("outbox: delete dispatched events: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Undispatched counts the events waiting for a dispatcher.
func Undispatched(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	if err := pool.QueryRow(ctx, sqlUndispatched).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: count undispatched: %w", err)
	}
	return n, nil
}

// rawArgs enqueues an encoded Delivery under a subscription's kind.
type rawArgs struct {
	kind string
	body []byte
}

func (a rawArgs) Kind() string                 { return a.kind }
func (a rawArgs) MarshalJSON() ([]byte, error) { return a.body, nil }
