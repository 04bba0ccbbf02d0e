package jobinsert

import (
	"context"
	"encoding/json"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// InstrumentationName names Relay's tracer and meter.
const InstrumentationName = "github.com/relayq/relay"

// TraceParentKey is the metadata key of the W3C trace context's
// traceparent stored with each job (core.MetaTraceParent).
const TraceParentKey = "traceparent"

// StartSpan starts the producer span of an insert of n jobs into queue
// (the first job's queue for a batch) with tp (nil: the global provider).
// It returns the span and the trace context to store in each job's
// metadata (WithTraceMetadata; nil when the span is not recording).
func StartSpan(ctx context.Context, tp trace.TracerProvider, queue string, n int) (context.Context, trace.Span, map[string]string) {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	ctx, span := tp.Tracer(InstrumentationName).Start(ctx, "send "+queue,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", "relay"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.operation.name", "send"),
			attribute.String("messaging.destination.name", queue),
		))
	if !span.SpanContext().IsValid() {
		return ctx, span, nil
	}
	if n > 1 {
		span.SetAttributes(attribute.Int("messaging.batch.message_count", n))
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return ctx, span, carrier
}

// WithTraceMetadata adds the trace context tc to a job's encoded metadata,
// unless it holds a traceparent already (the caller chose one). The
// caller's values are kept byte for byte (json.RawMessage): decoding them
// into map[string]any would turn every number into a float64 and change
// 1234567890123456789 into 1234567890123456800.
func WithTraceMetadata(meta json.RawMessage, tc map[string]string) (json.RawMessage, error) {
	m := map[string]json.RawMessage{}
	if err := json.Unmarshal(meta, &m); err != nil {
		return nil, err
	}
	if _, set := m[TraceParentKey]; set {
		return meta, nil
	}
	for k, v := range tc {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		m[k] = b
	}
	return json.Marshal(m)
}

// NewCounter makes the relay.jobs.enqueued counter of mp.
func NewCounter(mp metric.MeterProvider) (metric.Int64Counter, error) {
	return mp.Meter(InstrumentationName).Int64Counter("relay.jobs.enqueued",
		metric.WithDescription("Jobs enqueued."), metric.WithUnit("{job}"))
}

// Count adds the rows inserted (those for which inserted says so) to ctr
// (nil: the relay.jobs.enqueued counter of the global meter), by queue and
// kind.
func Count(ctx context.Context, ctr metric.Int64Counter, rows []Row, inserted func(i int) bool) {
	if ctr == nil {
		var err error
		if ctr, err = NewCounter(otel.GetMeterProvider()); err != nil {
			return
		}
	}
	type qk struct{ queue, kind string }
	counts := map[qk]int64{}
	for i, r := range rows {
		if inserted(i) {
			counts[qk{r.Queue, r.Kind}]++
		}
	}
	for k, n := range counts {
		ctr.Add(ctx, n, metric.WithAttributes(attribute.String("queue", k.queue), attribute.String("kind", k.kind)))
	}
}
