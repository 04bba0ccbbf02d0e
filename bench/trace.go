package bench

import (
	"context"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// EnvTrace, set to 1, makes benchmark processes record every span (to an
// exporter that discards them): the cost of tracing with a tracer
// configured, against the default of none.
const EnvTrace = "RELAY_BENCH_TRACE"

// InstallTracing sets a recording, discarding tracer provider as the global
// one and returns its shutdown.
func InstallTracing() func() {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	otel.SetTracerProvider(tp)
	return func() { tp.Shutdown(context.Background()) } //nolint:errcheck
}

type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }
