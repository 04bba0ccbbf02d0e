package workflow_test

import (
	"context"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/codes"
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

// Counted once: an eager run's attempt is started once (relay.jobs.started)
// and its job enqueued once; the refused duplicate starts count nothing.
func TestEagerCountedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	wf := workflow.MustRegister(b.reg, "eager.counted", func(wctx workflow.Context, in int) (int, error) { return in, nil })
	c := b.startWith(&core.Config{MeterProvider: mp})
	for i := 0; i < 3; i++ {
		if out, err := workflow.RunNow(callerCtx(t), c, wf, 7, &workflow.StartOpts{ID: "counted"}); err != nil || out != 7 {
			t.Fatalf("RunNow: %d, %v", out, err)
		}
	}
	b.waitFor("the job recorded succeeded", func() bool {
		return b.count(`SELECT count(*) FROM relay_jobs WHERE state = 'succeeded'`) == 1
	})
	sum := func(name string) int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
					for _, dp := range s.DataPoints {
						n += dp.Value
					}
				}
			}
		}
		return n
	}
	b.waitFor("succeeded counted", func() bool { return sum("relay.jobs.succeeded") >= 1 })
	for name, want := range map[string]int64{"relay.jobs.enqueued": 1, "relay.jobs.started": 1, "relay.jobs.succeeded": 1} {
		if got := sum(name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
}

// A RunNow of an id in use (IDConflictUseExisting, the default) is no
// failure: it returns the existing run's result. Its spans should not say
// it failed.
func TestEagerDuplicateIDSpansNoError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	b.reg = workflow.NewRegistry(b.pool, &workflow.Config{TracerProvider: tp})
	wf := workflow.MustRegister(b.reg, "eager.dupspan", func(wctx workflow.Context, in int) (int, error) { return in, nil })
	c := b.startWith(&core.Config{TracerProvider: tp})
	ctx := callerCtx(t)
	if _, err := workflow.RunNow(ctx, c, wf, 1, &workflow.StartOpts{ID: "dupspan"}); err != nil {
		t.Fatal(err)
	}
	before := len(spans.Ended())
	if out, err := workflow.RunNow(ctx, c, wf, 1, &workflow.StartOpts{ID: "dupspan"}); err != nil || out != 1 {
		t.Fatalf("duplicate: %d, %v", out, err)
	}
	for _, s := range spans.Ended()[before:] {
		if s.Status().Code == codes.Error {
			t.Errorf("span %q of the duplicate start ended with error %q", s.Name(), s.Status().Description)
		}
	}
}

// A RunNow that falls back to a queued start (every slot of the queue
// busy) is still the client's start: its job is counted on the client's
// relay.jobs.enqueued and spanned by the client's tracer provider, as the
// RunNow whose job is inserted queued by a pause is: the same call is
// counted in the same place however busy the queue was.
func TestEagerFallbackCountedByTheClient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	release := make(chan struct{})
	var started atomic.Int32
	wf := workflow.MustRegister(b.reg, "eager.fallback.counted", func(wctx workflow.Context, block bool) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) {
			started.Add(1)
			if block {
				<-release
			}
			return 1, nil
		}, nil)
	})
	c := b.startWith(&core.Config{MeterProvider: mp, TracerProvider: tp,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	ctx := callerCtx(t)
	first := make(chan error, 1)
	go func() { _, err := workflow.RunNow(ctx, c, wf, true, nil); first <- err }()
	b.waitFor("the first run holds the only slot", func() bool { return started.Load() == 1 })
	second := make(chan error, 1)
	go func() { _, err := workflow.RunNow(ctx, c, wf, false, nil); second <- err }()
	b.waitFor("the second run started queued", func() bool {
		return b.count(`SELECT count(*) FROM relay_jobs WHERE state = 'queued'`) == 1
	})
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
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
	var sends int
	for _, s := range spans.Ended() {
		if s.Name() == "send default" {
			sends++
		}
	}
	if enqueued != 2 || sends != 2 {
		t.Fatalf("two RunNow calls on the client: relay.jobs.enqueued %d, producer spans %d on the client's providers, want 2 and 2", enqueued, sends)
	}
}
