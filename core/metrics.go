package core

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/relayq/relay/internal/jobinsert"
)

// metrics are a client's instruments, from Config.MeterProvider (default:
// the global one; with none set they cost next to nothing). Names follow
// OpenTelemetry's conventions; the Prometheus exporter turns relay.jobs.started
// into relay_jobs_started_total, and so on.
type metrics struct {
	started, succeeded, retried, dead, cancelled, leaseLost metric.Int64Counter
	enqueued                                                metric.Int64Counter // the client's Enqueue methods
	gauges                                                  metric.Registration
	duration, pickup                                        metric.Float64Histogram
	mu                                                      sync.RWMutex
	attrs                                                   map[string]map[string]metric.MeasurementOption // queue → kind →
}

func newMetrics(c *Client) (*metrics, error) {
	mp := c.cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	out := &metrics{}
	var err error
	counter := func(name, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var ctr metric.Int64Counter
		ctr, err = m.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{job}"))
		return ctr
	}
	out.started = counter("relay.jobs.started", "Attempts started.")
	out.succeeded = counter("relay.jobs.succeeded", "Jobs whose success was recorded.")
	out.retried = counter("relay.jobs.retried", "Failed attempts that will be retried.")
	out.dead = counter("relay.jobs.dead", "Jobs that failed for good.")
	out.cancelled = counter("relay.jobs.cancelled", "Running jobs stopped by a cancel.")
	out.leaseLost = counter("relay.jobs.lease_lost", "Attempts whose lease was gone when they finished.")
	if err != nil {
		return nil, err
	}
	if out.enqueued, err = jobinsert.NewCounter(mp); err != nil {
		return nil, err
	}
	buckets := metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
	if out.duration, err = m.Float64Histogram("relay.job.duration", metric.WithUnit("s"),
		metric.WithDescription("Handler run time per attempt."), buckets); err != nil {
		return nil, err
	}
	if out.pickup, err = m.Float64Histogram("relay.job.pickup_latency", metric.WithUnit("s"),
		metric.WithDescription("From when a job became runnable to its claim (database time)."), buckets); err != nil {
		return nil, err
	}

	// Queue depth and the age of the oldest runnable job, read from the
	// database when collected, at most every 5 s whatever the scrape rate.
	depth, err := m.Int64ObservableGauge("relay.queue.depth", metric.WithUnit("{job}"),
		metric.WithDescription("Runnable jobs waiting, by queue."))
	if err != nil {
		return nil, err
	}
	age, err := m.Float64ObservableGauge("relay.queue.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("How long the oldest runnable job of each queue has waited."))
	if err != nil {
		return nil, err
	}
	cache := &depthCache{c: c}
	out.gauges, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		for _, q := range cache.read(ctx) {
			set := metric.WithAttributes(attribute.String("queue", q.queue))
			o.ObserveInt64(depth, q.depth, set)
			o.ObserveFloat64(age, q.oldest, set)
		}
		return nil
	}, depth, age)
	return out, err
}

// close unregisters the queue gauges: a stopped client reports nothing
// rather than the depth it last read.
func (m *metrics) close() {
	if m.gauges != nil {
		m.gauges.Unregister() //nolint:errcheck // nothing to do about it
	}
}

// with returns the attributes of a job's measurements, cached per queue and
// kind so the hot path does not allocate.
func (m *metrics) with(row *JobRow) metric.MeasurementOption {
	m.mu.RLock()
	opt, ok := m.attrs[row.Queue][row.Kind]
	m.mu.RUnlock()
	if ok {
		return opt
	}
	opt = metric.WithAttributeSet(attribute.NewSet(attribute.String("queue", row.Queue), attribute.String("kind", row.Kind)))
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.attrs == nil {
		m.attrs = map[string]map[string]metric.MeasurementOption{}
	}
	if m.attrs[row.Queue] == nil {
		m.attrs[row.Queue] = map[string]metric.MeasurementOption{}
	}
	m.attrs[row.Queue][row.Kind] = opt
	return opt
}

// of returns the attributes of a claimed job's measurements: those its
// attempt looked up at claim time, else with's.
func (m *metrics) of(row *JobRow) metric.MeasurementOption {
	if r := row.run; r != nil && r.attrs != nil {
		return r.attrs
	}
	return m.with(row)
}

type queueDepth struct {
	queue  string
	depth  int64
	oldest float64
}

// depthCache reads queue depths at most every 5 seconds.
type depthCache struct {
	c     *Client
	mu    sync.Mutex
	at    time.Time
	last  []queueDepth
	known map[string]bool // queues reported so far
}

func (d *depthCache) read(ctx context.Context) []queueDepth {
	d.mu.Lock()
	defer d.mu.Unlock()
	if time.Since(d.at) < 5*time.Second {
		return d.last
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rows, err := d.c.pool.Query(ctx, sqlQueueDepths)
	if err != nil {
		return d.last
	}
	defer rows.Close()
	var out []queueDepth
	seen := map[string]bool{}
	for rows.Next() {
		var q queueDepth
		if rows.Scan(&q.queue, &q.depth, &q.oldest) == nil {
			out = append(out, q)
			seen[q.queue] = true
		}
	}
	if rows.Err() != nil {
		return d.last
	}
	// A drained queue has no row: it reads 0, not nothing, for every queue
	// this client serves or has seen with jobs.
	if d.known == nil {
		d.known = map[string]bool{}
	}
	for name := range d.c.queues {
		d.known[name] = true
	}
	for name := range d.known {
		if !seen[name] {
			out = append(out, queueDepth{queue: name})
		}
	}
	for name := range seen {
		d.known[name] = true
	}
	d.at, d.last = time.Now(), out
	return out
}
