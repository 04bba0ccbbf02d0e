package core_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type cardError struct{ code string }

func (e *cardError) Error() string { return "card declined: " + e.code }

type orderArgs struct {
	OrderID int64 `json:"order_id"`
}

func (orderArgs) Kind() string { return "order" }

// With only Config.TracerProvider set (no global provider), a job enqueued
// through the client joins the caller's trace and its attempts are
// children of the enqueue; the caller's metadata numbers are stored
// exactly; error.type names the underlying error's type, not Relay's
// wrappers; the enqueue is counted by the client's meter.
func TestClientTelemetryWithoutGlobalProviders(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	ws := core.NewWorkers()
	var runs int
	core.MustAddWorker(ws, core.WorkFunc[orderArgs](func(ctx context.Context, j *core.Job[orderArgs]) error {
		runs++ // one worker: no race
		if runs == 1 {
			return core.RetryIn(0, fmt.Errorf("charge order %d: %w", j.Args.OrderID, &cardError{"51"}))
		}
		return nil
	}))
	c := startClient(t, pool, &core.Config{Workers: ws, TracerProvider: tp, MeterProvider: mp,
		Queues: map[string]core.QueueConfig{"default": {MaxWorkers: 1}}})

	reqCtx, req := tp.Tracer("test").Start(ctx, "POST /orders")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.EnqueueTx(reqCtx, tx, orderArgs{OrderID: 7}, &core.EnqueueOpts{
		Metadata: map[string]any{"order_id": int64(1234567890123456789), "nested": map[string]any{"n": uint64(18446744073709551615)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	req.End()
	waitState(t, pool, res.ID, core.StateSucceeded)

	var stored string
	if err := pool.QueryRow(ctx, `SELECT metadata::text FROM relay_jobs WHERE id = $1`, res.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stored, `"order_id": 1234567890123456789`) || !strings.Contains(stored, "18446744073709551615") {
		t.Fatalf("metadata numbers changed: %s", stored)
	}
	var meta map[string]json.RawMessage
	json.Unmarshal([]byte(stored), &meta)
	if !strings.Contains(string(meta[core.MetaTraceParent]), req.SpanContext().TraceID().String()) {
		t.Fatalf("the job did not join the request's trace through the client's provider: %s", stored)
	}

	waitFor(t, "both attempt spans", func() bool {
		n := 0
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindConsumer {
				n++
			}
		}
		return n == 2
	})
	var producer sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindProducer {
			producer = s
		}
	}
	if producer == nil || producer.Parent().SpanID() != req.SpanContext().SpanID() {
		t.Fatalf("enqueue span %v is not a child of the request", producer)
	}
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		if s.Parent().SpanID() != producer.SpanContext().SpanID() {
			t.Errorf("attempt span is not a child of the enqueue")
		}
		if et := attr(s, "error.type").AsString(); et != "" && et != "*core_test.cardError" {
			t.Errorf("error.type = %q, want the underlying *core_test.cardError", et)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	if v := sumOf(rm, "relay.jobs.enqueued"); v != 1 {
		t.Fatalf("relay.jobs.enqueued on the client's meter = %d, want 1", v)
	}
}

// The queue-depth gauge reads 0 for a drained queue (not nothing), and a
// stopped client's gauge is unregistered.
func TestQueueDepthGauge(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	release := make(chan struct{})
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		<-release
		return nil
	}))
	for range 3 {
		if _, err := core.Enqueue(ctx, pool, echoArgs{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Two jobs wait while one runs.
	c, err := core.NewClient(pool, &core.Config{Workers: ws, MeterProvider: mp, Queues: map[string]core.QueueConfig{"default": {MaxWorkers: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	depth := func() (int64, bool) {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "relay.queue.depth" {
					for _, dp := range g.DataPoints {
						return dp.Value, true
					}
				}
			}
		}
		return 0, false
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if d, ok := depth(); !ok || d < 2 {
		t.Fatalf("depth with jobs waiting = %d (%v)", d, ok)
	}
	close(release)
	waitFor(t, "the drained queue's depth to read 0", func() bool { d, ok := depth(); return ok && d == 0 })
	stop, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Stop(stop); err != nil {
		t.Fatal(err)
	}
	if d, ok := depth(); ok {
		t.Fatalf("a stopped client still reports depth %d", d)
	}
}

func sumOf(rm metricdata.ResourceMetrics, name string) int64 {
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range s.DataPoints {
					total += dp.Value
				}
			}
		}
	}
	return total
}
