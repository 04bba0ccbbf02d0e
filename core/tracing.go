package core

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/internal/jobinsert"
)

// TraceMode says how an attempt's span relates to the job's enqueue.
type TraceMode int

const (
	// TraceParent (the default) makes every attempt's span a child of the
	// enqueue's span: a job's whole life, every retry included, is one
	// trace. The trace stays open as long as the job retries (hours, with
	// backoff), which some backends show as one long trace.
	TraceParent TraceMode = iota
	// TraceLink starts each attempt in a trace of its own, linked to the
	// enqueue's span: the OpenTelemetry messaging conventions' default.
	// Traces stay short; following a job across attempts takes the link.
	TraceLink
)

// instrumentationName names Relay's tracer and meter.
const instrumentationName = jobinsert.InstrumentationName

// Metadata keys of the W3C trace context stored with each job.
const (
	MetaTraceParent = "traceparent"
	MetaTraceState  = "tracestate"
)

// traceContext is W3C Trace Context, the format stored in job metadata
// whatever propagator the process has configured.
var traceContext = propagation.TraceContext{}

// tracer returns the tracer of tp, or of the global provider when tp is nil.
func tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(instrumentationName)
}

// startEnqueueSpan starts the producer span of an enqueue of n jobs into
// queue (see jobinsert.StartSpan).
func startEnqueueSpan(ctx context.Context, tp trace.TracerProvider, queue string, n int) (context.Context, trace.Span, map[string]string) {
	return jobinsert.StartSpan(ctx, tp, queue, n)
}

// withTraceMetadata adds the trace context to a job's encoded metadata
// (see jobinsert.WithTraceMetadata).
func withTraceMetadata(meta json.RawMessage, tc map[string]string) (json.RawMessage, error) {
	return jobinsert.WithTraceMetadata(meta, tc)
}

// startAttemptSpan starts the consumer span of one attempt, named name
// ("process " + its queue; made for it when empty), from the trace context
// stored with the job.
func (c *Client) startAttemptSpan(ctx context.Context, row *JobRow, name string) (context.Context, trace.Span) {
	if name == "" {
		name = "process " + row.Queue
	}
	// Cheap when nothing traces: no metadata parse unless a trace context
	// was stored, attributes only on a recording span.
	if bytes.Contains(row.Metadata, []byte(MetaTraceParent)) {
		var m map[string]json.RawMessage
		if json.Unmarshal(row.Metadata, &m) == nil {
			stored := propagation.MapCarrier{}
			for _, k := range []string{MetaTraceParent, MetaTraceState} {
				var v string
				if json.Unmarshal(m[k], &v) == nil && v != "" {
					stored[k] = v
				}
			}
			parent := trace.SpanContextFromContext(traceContext.Extract(context.Background(), stored))
			if parent.IsValid() {
				if c.cfg.TraceMode == TraceLink {
					ctx, span := c.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer),
						trace.WithLinks(trace.Link{SpanContext: parent}), trace.WithNewRoot())
					return ctx, withAttemptAttributes(span, row)
				}
				ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
			}
		}
	}
	ctx, span := c.tracer.Start(ctx, name, c.attemptSpan...)
	return ctx, withAttemptAttributes(span, row)
}

func withAttemptAttributes(span trace.Span, row *JobRow) trace.Span {
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("messaging.system", "relay"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.operation.name", "process"),
			attribute.String("messaging.destination.name", row.Queue),
			attribute.String("messaging.message.id", strconv.FormatInt(row.ID, 10)),
			attribute.String("relay.job.kind", row.Kind),
			attribute.Int("relay.job.attempt", row.Attempt),
		)
	}
	return span
}

// endAttemptSpan records an attempt's outcome on its span.
func endAttemptSpan(span trace.Span, err error, outcome JobState, retryIn time.Duration) {
	if !span.IsRecording() {
		span.End()
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(attribute.String("error.type", errorType(err)))
		switch outcome {
		case StateQueued:
			span.SetAttributes(attribute.String("relay.job.retry_at", time.Now().Add(retryIn).UTC().Format(time.RFC3339Nano)))
			span.AddEvent("retry scheduled", trace.WithAttributes(attribute.String("relay.job.retry_in", retryIn.String())))
		case StateDead:
			span.AddEvent("job dead: attempts exhausted or permanent failure")
		}
	}
	span.End()
}

// errorType names an error's kind for error.type: a stable category for
// Relay's own outcomes (lease_lost, cancelled, shutdown, unknown_kind,
// undecodable, panic, timeout, permanent), else the Go type of the
// underlying error — beneath RetryIn and fmt.Errorf's %w wrappers, which
// say nothing about what failed.
func errorType(err error) string {
	switch {
	case errors.Is(err, ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, ErrJobCancelled):
		return "cancelled"
	case errors.Is(err, ErrShutdown):
		return "shutdown"
	case errors.Is(err, ErrUnknownKind):
		return "unknown_kind"
	case errors.Is(err, ErrUndecodableJob):
		return "undecodable"
	}
	var pe *PanicError
	if errors.As(err, &pe) {
		return "panic"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	var perm *permanentError
	if errors.As(err, &perm) {
		return "permanent"
	}
	for {
		var next error
		switch e := err.(type) {
		case *retryInError:
			if e.err == nil {
				return "retry_in"
			}
			next = e.err
		default:
			// fmt.Errorf's wrappers (one %w) carry no meaning of their own.
			if t := fmt.Sprintf("%T", err); t == "*fmt.wrapError" {
				next = errors.Unwrap(err)
			}
		}
		if next == nil {
			return fmt.Sprintf("%T", err)
		}
		err = next
	}
}
