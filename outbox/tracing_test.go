package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/testkit/testdb"
)

// Each event's jobs continue the trace of the request that published it —
// as children (TraceParent) or in traces of their own linked to it
// (TraceLink) — even when one dispatch batch moves events of many requests;
// events published outside any trace get a trace each. (Before: every job
// of a batch shared one new trace and the publishers' were dropped.)
func TestEventJobsContinueThePublishersTrace(t *testing.T) {
	t.Parallel()
	for _, mode := range []core.TraceMode{core.TraceParent, core.TraceLink} {
		t.Run(map[core.TraceMode]string{core.TraceParent: "parent", core.TraceLink: "link"}[mode], func(t *testing.T) {
			t.Parallel()
			pool := testdb.New(t)
			ctx := context.Background()
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))

			// Three requests publish an event each; two events come from no
			// request at all.
			requestTrace := map[int64]trace.TraceID{}
			for i := range 3 {
				rctx, span := tp.Tracer("test").Start(ctx, "POST /pay")
				id, err := outbox.Publish(rctx, pool, outbox.Event{Topic: "payment.succeeded", Payload: i})
				if err != nil {
					t.Fatal(err)
				}
				span.End()
				requestTrace[id] = span.SpanContext().TraceID()
			}
			for i := range 2 {
				if _, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "payment.succeeded", Payload: 10 + i}); err != nil {
					t.Fatal(err)
				}
			}
			d, err := outbox.NewDispatcher(pool, &outbox.Config{TracerProvider: tp,
				Subscriptions: []outbox.Subscription{{Topic: "payment.succeeded", Kind: "consume"}}})
			if err != nil {
				t.Fatal(err)
			}
			if n, err := d.DispatchOnce(ctx); err != nil || n != 5 {
				t.Fatalf("dispatched %d (%v), want all 5 in one batch", n, err)
			}

			var mu sync.Mutex
			attempt := map[int64]trace.SpanContext{} // event → its job's attempt span
			ws := core.NewWorkers()
			core.MustAddWorker(ws, core.WorkFunc[consume](func(ctx context.Context, j *core.Job[consume]) error {
				mu.Lock()
				attempt[j.Args.EventID] = trace.SpanContextFromContext(ctx)
				mu.Unlock()
				return nil
			}))
			c, err := core.NewClient(pool, &core.Config{Workers: ws, TracerProvider: tp, TraceMode: mode, PollInterval: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer c.Stop(context.Background())
			testdb.WaitFor(t, "five jobs", func() bool { return c.Stats().Succeeded == 5 })

			// Each attempt's trace, or the trace it links to.
			linked := map[trace.SpanID]trace.TraceID{}
			for _, s := range rec.Ended() {
				for _, l := range s.Links() {
					linked[s.SpanContext().SpanID()] = l.SpanContext.TraceID()
				}
			}
			seen := map[trace.TraceID]int64{}
			mu.Lock()
			defer mu.Unlock()
			for ev, sc := range attempt {
				got := sc.TraceID()
				if mode == core.TraceLink {
					got = linked[sc.SpanID()]
				}
				if want, ok := requestTrace[ev]; ok && got != want {
					t.Errorf("event %d: job in trace %s, want its request's %s", ev, got, want)
				}
				if other, dup := seen[got]; dup {
					t.Errorf("events %d and %d share trace %s", other, ev, got)
				}
				seen[got] = ev
			}
			if len(attempt) != 5 {
				t.Errorf("%d events' jobs ran, want 5", len(attempt))
			}
		})
	}
}

// A stored trace context that is not the {"traceparent": ...} object
// Publish writes (another publisher's format, a hand edit) costs the event
// its parent, never the dispatch: the event and every one after it become
// jobs, each in a trace of its own.
func TestBadStoredTraceContextIsIgnored(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	if _, err := pool.Exec(ctx, `
		INSERT INTO relay_outbox (topic, payload, headers, trace_context)
		SELECT 'payment.succeeded', '{}', '{}', tc::jsonb
		FROM unnest(ARRAY['[1]', '"00-abc"', '{"traceparent": 5}', '{"traceparent": "garbage"}', 'null']) tc`); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "payment.succeeded", Payload: 1}); err != nil {
		t.Fatal(err)
	}
	d, err := outbox.NewDispatcher(pool, &outbox.Config{TracerProvider: tp,
		Subscriptions: []outbox.Subscription{{Topic: "payment.succeeded", Kind: "consume"}}})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := d.DispatchOnce(ctx); err != nil || n != 6 {
		t.Fatalf("dispatched %d (%v); want all 6 events", n, err)
	}
	if n := count(t, pool, `SELECT count(DISTINCT metadata->>'traceparent') FROM relay_jobs WHERE metadata->>'traceparent' LIKE '00-%'`); n != 6 {
		t.Errorf("%d distinct valid traceparents on the 6 jobs; want one trace each", n)
	}
}
