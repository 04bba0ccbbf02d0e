package core_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type tracedArgs struct {
	Fails int `json:"fails"`
}

func (tracedArgs) Kind() string { return "traced" }

func attr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// A job that fails twice, then succeeds: its enqueue and three attempts
// are one trace (or, with TraceLink, three traces linked to the enqueue),
// named and attributed per the messaging conventions, the failed attempts
// with error status, and the handler's own spans nest under its attempt.
func TestTracing(t *testing.T) {
	// The global provider is process-wide: not parallel.
	// Restore "no tracing" after (setting the previous global back is a
	// no-op in otel: it is the delegate itself).
	defer otel.SetTracerProvider(noop.NewTracerProvider())
	for _, mode := range []core.TraceMode{core.TraceParent, core.TraceLink} {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		otel.SetTracerProvider(tp)
		pool := testdb.New(t)
		ctx := context.Background()
		var runs atomic.Int32
		ws := core.NewWorkers()
		core.MustAddWorker(ws, core.WorkFunc[tracedArgs](func(ctx context.Context, j *core.Job[tracedArgs]) error {
			_, span := otel.Tracer("handler").Start(ctx, "charge card")
			defer span.End()
			if int(runs.Add(1)) <= j.Args.Fails {
				return core.RetryIn(0, errors.New("card network timeout"))
			}
			return nil
		}))
		res, err := core.Enqueue(ctx, pool, tracedArgs{Fails: 2}, nil)
		if err != nil {
			t.Fatal(err)
		}
		c := startClient(t, pool, &core.Config{Workers: ws, TracerProvider: tp, TraceMode: mode, PollInterval: 20e6})
		waitFor(t, "the job to succeed", func() bool { return c.Stats().Succeeded == 1 })

		var producer sdktrace.ReadOnlySpan
		var attempts, handlers []sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			switch {
			case s.SpanKind() == trace.SpanKindProducer && attr(s, "messaging.message.id").AsString() == jsonID(res.ID):
				producer = s
			case s.SpanKind() == trace.SpanKindConsumer && attr(s, "messaging.message.id").AsString() == jsonID(res.ID):
				attempts = append(attempts, s)
			case s.Name() == "charge card":
				handlers = append(handlers, s)
			}
		}
		if producer == nil || producer.Name() != "send default" || attr(producer, "messaging.system").AsString() != "relay" {
			t.Fatalf("mode %d: producer span %v", mode, producer)
		}
		if len(attempts) != 3 {
			t.Fatalf("mode %d: %d attempt spans, want 3", mode, len(attempts))
		}
		// Spans are recorded as they end, and an attempt's span ends after
		// its outcome is written, so a quick next attempt may end first.
		slices.SortFunc(attempts, func(a, b sdktrace.ReadOnlySpan) int {
			return cmp.Compare(attr(a, "relay.job.attempt").AsInt64(), attr(b, "relay.job.attempt").AsInt64())
		})
		j, err := core.JobGet(ctx, pool, res.ID)
		if err != nil {
			t.Fatal(err)
		}
		var meta map[string]string
		json.Unmarshal(j.Metadata, &meta)
		if !strings.Contains(meta[core.MetaTraceParent], producer.SpanContext().TraceID().String()) {
			t.Errorf("metadata %v lacks the enqueue's trace", meta)
		}
		for i, a := range attempts {
			if a.Name() != "process default" || attr(a, "relay.job.attempt").AsInt64() != int64(i+1) ||
				attr(a, "messaging.operation.type").AsString() != "process" || attr(a, "relay.job.kind").AsString() != "traced" {
				t.Errorf("attempt span %d: %s %v", i, a.Name(), a.Attributes())
			}
			failed := i < 2
			if failed != (a.Status().Code == codes.Error) || failed != (attr(a, "error.type").AsString() != "") {
				t.Errorf("attempt %d: status %v, error.type %q", i+1, a.Status(), attr(a, "error.type").AsString())
			}
			if failed && attr(a, "relay.job.retry_at").AsString() == "" {
				t.Errorf("attempt %d: no retry time recorded", i+1)
			}
			switch mode {
			case core.TraceParent:
				if a.SpanContext().TraceID() != producer.SpanContext().TraceID() || a.Parent().SpanID() != producer.SpanContext().SpanID() {
					t.Errorf("attempt %d is not a child of the enqueue", i+1)
				}
			case core.TraceLink:
				if a.SpanContext().TraceID() == producer.SpanContext().TraceID() || len(a.Links()) != 1 ||
					a.Links()[0].SpanContext.SpanID() != producer.SpanContext().SpanID() {
					t.Errorf("attempt %d is not a linked root", i+1)
				}
			}
		}
		for _, h := range handlers[len(handlers)-3:] {
			found := false
			for _, a := range attempts {
				if h.Parent().SpanID() == a.SpanContext().SpanID() {
					found = true
				}
			}
			if !found {
				t.Errorf("a handler span does not nest under an attempt")
			}
		}
	}
}

func jsonID(id int64) string { b, _ := json.Marshal(id); return string(b) }
