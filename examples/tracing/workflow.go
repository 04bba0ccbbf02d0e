package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/devpg"
	"github.com/relayq/relay/workflow"
)

// runWorkflow runs charge → (email ∥ report, child runs on the "email"
// queue) → notify, the email step failing twice, exported over OTLP, and
// returns the run's trace id: the whole run, its children, every execution
// and every step attempt are one trace.
func runWorkflow(ctx context.Context, url string, out io.Writer) (string, error) {
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return "", err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter, sdktrace.WithBatchTimeout(100*time.Millisecond)),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "relay-example-workflow"))),
	)
	defer tp.Shutdown(context.WithoutCancel(ctx)) //nolint:errcheck
	pool, closeDB, err := devpg.Open(ctx, url, out)
	if err != nil {
		return "", err
	}
	defer closeDB()

	reg := workflow.NewRegistry(pool, &workflow.Config{TracerProvider: tp})
	var emailAttempts atomic.Int32
	quick := &workflow.StepOpts{Retry: core.RetryPolicyFunc(func(int, error) time.Duration { return 100 * time.Millisecond })}
	email := workflow.MustRegister(reg, "email", func(wctx workflow.Context, order string) (string, error) {
		return workflow.Step(wctx, "send", func(ctx context.Context) (string, error) {
			if n := emailAttempts.Add(1); n <= 2 {
				fmt.Fprintf(out, "  email attempt %d: smtp timeout\n", n)
				return "", errors.New("smtp timeout")
			}
			return "receipt sent for " + order, nil
		}, quick)
	})
	report := workflow.MustRegister(reg, "report", func(wctx workflow.Context, order string) (string, error) {
		return workflow.Step(wctx, "write", func(ctx context.Context) (string, error) { return "report for " + order, nil }, nil)
	})
	flow := workflow.MustRegister(reg, "payment", func(wctx workflow.Context, order string) (string, error) {
		if _, err := workflow.Step(wctx, "charge", func(ctx context.Context) (string, error) { return "charged", nil }, nil); err != nil {
			return "", err
		}
		e := workflow.Child(wctx, "email", email, order, &workflow.ChildOpts{Queue: "email"})
		r := workflow.Child(wctx, "report", report, order, &workflow.ChildOpts{Queue: "email"})
		if _, err := e.Get(wctx); err != nil {
			return "", err
		}
		if _, err := r.Get(wctx); err != nil {
			return "", err
		}
		return workflow.Step(wctx, "notify", func(ctx context.Context) (string, error) { return "notified", nil }, nil)
	})
	ws := core.NewWorkers()
	if err := reg.AddWorkers(ws); err != nil {
		return "", err
	}
	client, err := core.NewClient(pool, &core.Config{Workers: ws, TracerProvider: tp, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {}, "email": {}}})
	if err != nil {
		return "", err
	}
	if err := client.Start(ctx); err != nil {
		return "", err
	}
	defer client.Stop(context.Background()) //nolint:errcheck
	h, err := workflow.Start(ctx, pool, flow, "42", nil)
	if err != nil {
		return "", err
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := h.Result(rctx, pool); err != nil {
		return "", err
	}
	run, err := workflow.Get(ctx, pool, h.ID)
	if err != nil {
		return "", err
	}
	client.Stop(context.Background()) //nolint:errcheck
	if err := tp.ForceFlush(ctx); err != nil {
		return "", fmt.Errorf("export: %w", err)
	}
	if len(run.TraceParent) < 35 {
		return "", errors.New("run has no trace context")
	}
	return run.TraceParent[3:35], nil
}
