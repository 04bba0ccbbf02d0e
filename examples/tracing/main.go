// Command tracing is Relay's tracing example: a job that fails twice and
// then succeeds, exported over OTLP, shows up in your tracing backend as one
// trace — the enqueue, three attempts (two with errors), and the handler's
// own span inside each.
//
//	OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 go run ./examples/tracing
//
// It prints the trace id whether or not a collector answered, and says so
// when none did. README.md says how to run one and see the trace.
//
// It uses $DATABASE_URL (in schema relay_example_tracing, reset at each
// run), or a throwaway PostgreSQL. Any OTLP/HTTP collector
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
	"strings"
	"sync"
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
	"github.com/relayq/relay/devdb"
)

// ChargeArgs is the job: charge an order's card.
type ChargeArgs struct {
	OrderID string `json:"order_id"`
}

func (ChargeArgs) Kind() string { return "payment.charge" }

func main() {
	res, err := run(context.Background(), os.Getenv("DATABASE_URL"), os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tracing:", err)
		os.Exit(1)
	}
	fmt.Printf("trace id: %s\n", res.TraceID)
	if res.ExportErr != nil {
		fmt.Printf(`no collector answered at %s: %v
The job ran and its trace was recorded, but it was not exported anywhere.
Start a collector and run again — see examples/tracing/README.md:
  docker run --rm -p 16686:16686 -p 4318:4318 cr.jaegertracing.io/jaegertracing/jaeger:2.15.0
then open http://localhost:16686/trace/<the new trace id>
`, res.Endpoint, res.ExportErr)
		return
	}
	fmt.Printf("exported to %s; in Jaeger: http://localhost:16686/trace/%s (or its query API: /api/v3/traces/%s)\n",
		res.Endpoint, res.TraceID, res.TraceID)
}

// result is what a run did.
type result struct {
	TraceID string
	// Endpoint is where the spans were sent; ExportErr why they did not
	// arrive (no collector answered), or nil.
	Endpoint  string
	ExportErr error
}

// exporterOptions reads OTEL_EXPORTER_OTLP_ENDPOINT as the OTLP/HTTP SDK
// does, except that a plain host:port, or nothing, means plain HTTP
// (http://localhost:4318): a local collector, not TLS.
func exporterOptions() ([]otlptracehttp.Option, string) {
	opts := []otlptracehttp.Option{
		otlptracehttp.WithTimeout(5 * time.Second),
		// Fail fast when nothing listens: the example says so instead of
		// retrying for a minute.
		otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}),
	}
	ep := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	switch {
	case ep == "":
		return append(opts, otlptracehttp.WithEndpoint("localhost:4318"), otlptracehttp.WithInsecure()),
			"http://localhost:4318 (the default; set OTEL_EXPORTER_OTLP_ENDPOINT to change it)"
	case !strings.Contains(ep, "://"):
		return append(opts, otlptracehttp.WithEndpoint(ep), otlptracehttp.WithInsecure()), "http://" + ep
	}
	return opts, ep // a URL: the SDK reads it, scheme included
}

// run sets up OTLP export, runs the job to success and returns its trace id
// and whether the export reached a collector.
func run(ctx context.Context, url string, out io.Writer) (result, error) {
	var res result
	opts, endpoint := exporterOptions()
	res.Endpoint = endpoint
	exporter, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return res, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter, sdktrace.WithBatchTimeout(100*time.Millisecond)),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "relay-example-tracing"))),
	)
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		tp.Shutdown(sctx) //nolint:errcheck // a failed export is reported by ForceFlush below
	}()
	otel.SetTracerProvider(tp)
	// A failed export is reported once, after the run, not logged by the
	// SDK at every retry and at shutdown. The batcher may export (and fail)
	// before the final ForceFlush, which then has nothing left to send: the
	// first error the SDK reports is kept for that case.
	var firstExportErr struct {
		sync.Mutex
		err error
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		firstExportErr.Lock()
		defer firstExportErr.Unlock()
		if firstExportErr.err == nil {
			firstExportErr.err = err
		}
	}))

	// A schema of its own, reset at each run: the example runs again and
	// again on a shared DATABASE_URL and never counts another run's rows.
	db, err := devdb.Open(ctx, devdb.Options{URL: url, Schema: "relay_example_tracing", Out: out})
	if err != nil {
		return res, err
	}
	defer db.Close()
	pool := db.Pool

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
		return res, err
	}
	if err := client.Start(ctx); err != nil {
		return res, err
	}
	defer client.Stop(context.Background())

	// The enqueue starts the trace (the caller has no span here).
	enq, err := core.Enqueue(ctx, pool, ChargeArgs{OrderID: "42"}, nil)
	if err != nil {
		return res, err
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		return res, errors.New("the job did not succeed")
	}
	for client.Stats().Succeeded == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	j, err := core.JobGet(ctx, pool, enq.ID)
	if err != nil {
		return res, err
	}
	client.Stop(context.Background())
	res.TraceID = traceIDOf(j)
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res.ExportErr = tp.ForceFlush(fctx)
	if res.ExportErr == nil {
		firstExportErr.Lock()
		res.ExportErr = firstExportErr.err
		firstExportErr.Unlock()
	}
	return res, nil
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
