package workflow_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// An eager start's job is the client's enqueue: counted on the client's
// meter (relay.jobs.enqueued) and its producer span made by the client's
// tracer provider, as the client's own enqueues are, not the global ones.
func TestEagerStartCountedAndSpannedByTheClient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	wf := workflow.MustRegister(b.reg, "eager.counted", func(wctx workflow.Context, in int) (int, error) {
		return in, nil
	})
	c := b.startWith(&core.Config{ID: "eager-counted", MeterProvider: mp, TracerProvider: tp})
	if out, err := workflow.RunNow(callerCtx(t), c, wf, 7, &workflow.StartOpts{ID: "eager-counted-1"}); err != nil || out != 7 {
		t.Fatalf("RunNow: %d, %v", out, err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var enqueued int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "relay.jobs.enqueued" {
				for _, dp := range s.DataPoints {
					enqueued += dp.Value
				}
			}
		}
	}
	if enqueued != 1 {
		t.Fatalf("relay.jobs.enqueued on the client's meter = %d, want 1 (the eager start's job)", enqueued)
	}
	var sends int
	for _, s := range spans.Ended() {
		if s.Name() == "send default" {
			sends++
		}
	}
	if sends != 1 {
		t.Fatalf("%d producer spans (send default) on the client's tracer provider, want 1", sends)
	}
}
