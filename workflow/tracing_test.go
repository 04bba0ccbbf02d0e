package workflow_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// One trace per run: the root span, every execution (across a suspension),
// every step attempt (failed ones marked) and the child run's spans share
// the run's trace id, and the child's root hangs under its parent.
func TestOneTracePerRun(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	pool := testdb.New(t)
	reg := workflow.NewRegistry(pool, &workflow.Config{TracerProvider: tp,
		ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
	b := &bundle{t: t, pool: pool, reg: reg}
	var fails atomic.Int32
	// The child's first attempt waits until its parent has suspended for
	// it, so that the parent has two executions to trace whatever the
	// timing.
	parentWaits := make(chan struct{})
	fast := &workflow.StepOpts{Retry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })}
	email := workflow.MustRegister(reg, "email", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "send", func(ctx context.Context) (int, error) {
			n := fails.Add(1)
			if n == 1 {
				select {
				case <-parentWaits:
				case <-ctx.Done():
					return 0, ctx.Err()
				}
			}
			if n <= 2 {
				return 0, errors.New("smtp timeout")
			}
			return 1, nil
		}, fast)
	})
	flow := workflow.MustRegister(reg, "flow", func(wctx workflow.Context, _ int) (int, error) {
		if _, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		if _, err := workflow.Child(wctx, "email", email, 0, &workflow.ChildOpts{Queue: "email"}).Get(wctx); err != nil {
			return 0, err
		}
		return workflow.Step(wctx, "notify", func(ctx context.Context) (int, error) { return 2, nil }, nil)
	})
	b.startWith(&core.Config{TracerProvider: tp}, core.DefaultQueue, "email")
	h, err := workflow.Start(context.Background(), pool, flow, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.waitFor("the parent suspended for its child", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs AS r JOIN relay_jobs AS j ON j.id = r.job_id
			WHERE r.id = $1 AND j.state = 'queued'
			  AND EXISTS (SELECT 1 FROM relay_workflow_steps AS s WHERE s.run_id = r.id AND s.key = 'email' AND s.state = 'waiting')`, h.ID) == 1
	})
	close(parentWaits)
	if _, err := result[int](t, pool, h.ID); err != nil {
		t.Fatal(err)
	}
	run, _ := workflow.Get(context.Background(), pool, h.ID)
	if run.TraceParent == "" {
		t.Fatal("no root trace context stored on the run")
	}
	var rootTrace string
	byName := map[string][]sdktrace.ReadOnlySpan{}
	b.waitFor("the last execution's span", func() bool {
		for _, s := range rec.Ended() {
			if s.Name() == "workflow.step notify" {
				return true
			}
		}
		return false
	})
	for _, s := range rec.Ended() {
		byName[s.Name()] = append(byName[s.Name()], s)
		if s.Name() == "workflow flow" {
			rootTrace = s.SpanContext().TraceID().String()
		}
	}
	if rootTrace == "" || len(byName["workflow flow"]) != 1 {
		t.Fatalf("root spans %d", len(byName["workflow flow"]))
	}
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID().String() != rootTrace {
			t.Errorf("span %q in trace %s, not the run's %s", s.Name(), s.SpanContext().TraceID(), rootTrace)
		}
	}
	if n := len(byName["workflow.execute flow"]); n < 2 {
		t.Errorf("%d executions of the parent traced, want ≥ 2 (it suspended for its child)", n)
	}
	sends := byName["workflow.step send"]
	errs := 0
	for _, s := range sends {
		if s.Status().Code == codes.Error {
			errs++
		}
	}
	if len(sends) != 3 || errs != 2 {
		t.Errorf("send attempts %d (errors %d), want 3 (2)", len(sends), errs)
	}
	if len(byName["workflow email"]) != 1 || !byName["workflow email"][0].Parent().IsValid() {
		t.Error("the child's root span is not under its parent")
	}
	for _, name := range []string{"workflow.step charge", "workflow.step notify", "workflow.child email", "workflow.execute email"} {
		if len(byName[name]) == 0 {
			t.Errorf("no span %q", name)
		}
	}
	_ = testdb.WaitFor
}
