package workflow

import (
	"context"
	"encoding/json"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// instrumentationName names the workflow layer's tracer (the core's, so a
// run's spans and its jobs' spans come from one instrumentation scope).
const instrumentationName = "github.com/relayq/relay"

// traceContext is the W3C format of the root context stored on a run row.
var traceContext = propagation.TraceContext{}

// rootContext returns ctx under the run's stored root span context, unless
// ctx already carries a span of the run's trace (the core's attempt span,
// parented from the job's metadata).
func rootContext(ctx context.Context, stored string) context.Context {
	if stored == "" || stored == "{}" {
		return ctx
	}
	carrier := propagation.MapCarrier{}
	if json.Unmarshal([]byte(stored), &carrier) != nil {
		return ctx
	}
	root := trace.SpanContextFromContext(traceContext.Extract(context.Background(), carrier))
	if !root.IsValid() {
		return ctx
	}
	if cur := trace.SpanContextFromContext(ctx); cur.IsValid() && cur.TraceID() == root.TraceID() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, root)
}

// endSpan ends span with err's status.
func endSpan(span trace.Span, err error, attrs ...attribute.KeyValue) {
	if span.IsRecording() {
		span.SetAttributes(attrs...)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}
