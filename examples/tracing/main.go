// Command tracing is Relay's tracing example: a job that fails twice and
// then succeeds, exported over OTLP, shows up in your tracing backend as one
// trace — the enqueue, three attempts (two with errors), and the handler's
// own span inside each.
//
//	OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 go run ./examples/tracing
//
// It uses $DATABASE_URL, or a throwaway PostgreSQL. Any OTLP/HTTP collector
// works: Jaeger, Tempo, Honeycomb, the OpenTelemetry Collector.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/devpg"
)

// ChargeArgs is the job: charge an order's card.
type ChargeArgs struct {
	OrderID string `json:"order_id"`
}

func (ChargeArgs) Kind() string { return "payment.charge" }

func main() {
	traceID, err := run(context.Background(), os.Getenv("DATABASE_URL"), os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tracing:", err)
		os.Exit(1)
	}
	fmt.Printf("trace %s exported to %s\n", traceID, os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

// run sets up OTLP export (configured by the standard OTEL_EXPORTER_OTLP_*
// variables), runs the job to success and returns its trace id.
func run(ctx context.Context, url string, out io.Writer) (string, error) {
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return "", err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter, sdktrace.WithBatchTimeout(100*time.Millisecond)),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "relay-example-tracing"))),
	)
	defer tp.Shutdown(context.WithoutCancel(ctx)) //nolint:errcheck
	otel.SetTracerProvider(tp)

	pool, closeDB, err := devpg.Open(ctx, url, out)
	if err != nil {
		return "", err
	}
	defer closeDB()

	var attempts atomic.Int32
	done := make(chan struct{})
	workers := core.NewWorkers()
	core.MustAddWorker(workers, core.WorkFunc[ChargeArgs](func(ctx context.Context, j *core.Job[ChargeArgs]) error {
		// The handler's own span nests under the attempt's.
		_, span := otel.Tracer("example").Start(ctx, "POST /v1/charges")
		defer span.End()
		if n := attempts.Add(1); n <= 2 {
			fmt.Fprintf(out, "  attempt %d: card network timeout\n", n)
			return core.RetryIn(100*time.Millisecond, errors.New("card network timeout"))
		}
		fmt.Fprintf(out, "  attempt 3: charged order %s\n", j.Args.OrderID)
		close(done)
		return nil
	}))
	client, err := core.NewClient(pool, &core.Config{Workers: workers, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return "", err
	}
	if err := client.Start(ctx); err != nil {
		return "", err
	}
	defer client.Stop(context.Background())

	// The enqueue starts the trace (the caller has no span here).
	res, err := core.Enqueue(ctx, pool, ChargeArgs{OrderID: "42"}, nil)
	if err != nil {
		return "", err
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		return "", errors.New("the job did not succeed")
	}
	for client.Stats().Succeeded == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	j, err := core.JobGet(ctx, pool, res.ID)
	if err != nil {
		return "", err
	}
	client.Stop(context.Background())
	if err := tp.ForceFlush(ctx); err != nil {
		return "", fmt.Errorf("export: %w", err)
	}
	return traceIDOf(j), nil
}

// traceIDOf reads the trace id from the job's stored trace context.
func traceIDOf(j *core.JobRow) string {
	var meta map[string]string
	if err := json.Unmarshal(j.Metadata, &meta); err != nil {
		return ""
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(meta))
	return trace.SpanContextFromContext(ctx).TraceID().String()
}
