package workflow_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// A RunNow whose eager statement finds the run's id held by a start not
// yet committed falls back to a queued start, and that start joins the
// eager attempt's root span: the caller's start is one root span (marked
// not eager, with the fallback as an event), not two.
func TestEagerHeldIDFallbackIsOneRootSpan(t *testing.T) {
	t.Parallel()
	h := holdRunID(t, "eager.held")
	ctx, tx := h.ctx, h.tx
	done := make(chan error, 1)
	var out int
	go func() {
		var err error
		out, err = workflow.RunNow(ctx, h.c, h.wf, 8, &workflow.StartOpts{ID: "held"})
		done <- err
	}()
	waitForQueuedStartBlocked(t, ctx, h.pool, done)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || out != 7 {
		t.Fatalf("RunNow: %d, %v; want the held run's 7", out, err)
	}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range h.rec.Ended() {
		if s.Name() == "workflow eager.held" && !s.Parent().IsValid() {
			roots = append(roots, s)
		}
	}
	if len(roots) != 2 {
		t.Fatalf("%d root spans named %q, want 2 (the held start's and RunNow's)", len(roots), "workflow eager.held")
	}
	var fallback sdktrace.ReadOnlySpan
	for _, s := range roots {
		for _, e := range s.Events() {
			if e.Name == "run id held by a start not yet committed: starting the run queued" {
				fallback = s
			}
		}
	}
	if fallback == nil {
		t.Fatal("no root span records the fallback to a queued start")
	}
	for _, a := range fallback.Attributes() {
		if a.Key == "relay.workflow.eager" && a.Value.AsBool() {
			t.Error("the fallback's root span is marked eager")
		}
	}
}

// The same fallback, its caller's ctx ending while the queued start waits
// for the held id: RunNow returns the ctx's error, and the one root span
// says the start failed (it ended with the start, before RunNow returned).
func TestEagerHeldIDFallbackFailureMarksTheSpan(t *testing.T) {
	t.Parallel()
	h := holdRunID(t, "eager.heldgone")
	ctx := h.ctx
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := workflow.RunNow(runCtx, h.c, h.wf, 8, &workflow.StartOpts{ID: "held"})
		done <- err
	}()
	waitForQueuedStartBlocked(t, ctx, h.pool, done)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("RunNow: %v, want context.Canceled", err)
	}
	var fallback sdktrace.ReadOnlySpan
	for _, s := range h.rec.Ended() {
		if s.Name() == "workflow eager.heldgone" && !s.Parent().IsValid() && len(s.Events()) > 0 {
			fallback = s
		}
	}
	if fallback == nil {
		t.Fatal("no ended root span of RunNow's start")
	}
	if st := fallback.Status(); st.Code != codes.Error || !strings.Contains(st.Description, "context canceled") {
		t.Fatalf("the failed start's root span has status %v %q, want an error naming the ctx's end", st.Code, st.Description)
	}
}

// A start that replaces a finished run of its id (IDReuseAllow) is one
// span, as any start: the new run's insert joins the span of the start
// that found and deleted the old one, and the new run's trace is that
// span's.
func TestReplacingStartIsOneSpan(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	pool := testdb.New(t)
	reg := workflow.NewRegistry(pool, &workflow.Config{TracerProvider: tp})
	b := &bundle{t: t, pool: pool, reg: reg}
	wf := workflow.MustRegister(reg, "reuse", func(wctx workflow.Context, in int) (int, error) { return in, nil })
	c := b.start()
	ctx := callerCtx(t)
	for i, reuse := range []workflow.IDReusePolicy{workflow.IDReuseRefuse, workflow.IDReuseAllow} {
		if out, err := workflow.RunNow(ctx, c, wf, i, &workflow.StartOpts{ID: "r", IDReuse: reuse}); err != nil || out != i {
			t.Fatalf("RunNow %d: %d, %v", i, out, err)
		}
	}
	var starts []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "workflow reuse" {
			starts = append(starts, s)
		}
	}
	if len(starts) != 2 {
		t.Fatalf("%d spans named %q for two starts, want 2", len(starts), "workflow reuse")
	}
	for _, s := range starts {
		if s.Parent().IsValid() {
			t.Errorf("a start's span has a parent (%s): a start nested in another", s.Parent().SpanID())
		}
	}
}

// heldRunID is a workflow whose run "held" is started, not committed, in tx
// on another pool, with spans recorded by rec, and a client c executing it.
type heldRunID struct {
	ctx  context.Context
	pool *pgxpool.Pool
	rec  *tracetest.SpanRecorder
	wf   *workflow.Workflow[int, int]
	c    *core.Client
	tx   pgx.Tx
}

// holdRunID registers workflow name (its output its input), starts its
// client, and holds run id "held" with a start of input 7 in an open
// transaction (rolled back at the test's end), the same registry's tracer
// spanning that start too.
func holdRunID(t *testing.T, name string) heldRunID {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	url := testdb.URL(t)
	pool := openSide(t, url)
	reg := workflow.NewRegistry(pool, &workflow.Config{TracerProvider: tp})
	b := &bundle{t: t, pool: pool, reg: reg}
	wf := workflow.MustRegister(reg, name, func(wctx workflow.Context, in int) (int, error) { return in, nil })
	c := b.startWith(&core.Config{ID: name})
	ctx := callerCtx(t)
	tx, err := openSide(t, url).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) }) //nolint:errcheck
	if _, err := workflow.Start(ctx, tx, wf, 7, &workflow.StartOpts{ID: "held"}); err != nil {
		t.Fatal(err)
	}
	return heldRunID{ctx: ctx, pool: pool, rec: rec, wf: wf, c: c, tx: tx}
}

// waitForQueuedStartBlocked waits until a queued start (startRun's
// statement, which names deadline_at; the eager one does not) waits for a
// lock, as RunNow's does after its eager statement found the run's id held,
// reading pg_stat_activity on pool (which must have a connection free; only
// its database's statements count: other tests share the cluster). It
// fails the test if done (RunNow's answer) comes first or ctx ends.
func waitForQueuedStartBlocked(t *testing.T, ctx context.Context, pool *pgxpool.Pool, done <-chan error) {
	t.Helper()
	for {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO relay_workflow_runs%deadline_at%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("RunNow returned before the held start committed: %v", err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
