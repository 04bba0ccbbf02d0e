package workflow_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/workflow"
)

// readCounter counts the statements sent on the connections it traces
// (n), and those answered (ended).
type readCounter struct{ n, ended atomic.Int64 }

func (c *readCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *readCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {
	c.ended.Add(1)
}

func (c *readCounter) reset() { c.n.Store(0); c.ended.Store(0) }

// A Handle.Result waiting in the process whose execution records the run's
// outcome gets that outcome as it was written, at once: its only read is
// the one before it waits (the run is not finished then), none after the
// run ends; completed and failed outcomes alike. A caller on another
// registry (another process) still reads the run when notified.
func TestResultGetsTheOutcomeRecordedHere(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gate := make(chan struct{})
	wf := workflow.MustRegister(b.reg, "delivered", func(wctx workflow.Context, n int) (map[string]int, error) {
		v, err := workflow.Step(wctx, "gated", func(context.Context) (int, error) { <-gate; return n, nil }, nil)
		if err != nil {
			return nil, err
		}
		if v < 0 {
			return nil, errors.New("negative input")
		}
		return map[string]int{"n": v}, nil
	})
	b.start()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	var reads readCounter
	cfg.ConnConfig.Tracer = &reads
	cfg.MaxConns = 2
	counted, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer counted.Close()

	// The listener's first connection wakes every caller to read again
	// (notifications may have been missed before it): connect it first.
	warm, err := workflow.Start(ctx, b.pool, wf, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { gate <- struct{}{} }()
	if _, err := warm.Result(ctx, b.pool); err != nil {
		t.Fatal(err)
	}

	for _, n := range []int{7, -1} {
		reads.reset()
		h, err := workflow.Start(ctx, b.pool, wf, n, nil)
		if err != nil {
			t.Fatal(err)
		}
		type res struct {
			out map[string]int
			err error
		}
		done := make(chan res, 1)
		go func() {
			out, err := h.Result(ctx, counted)
			done <- res{out, err}
		}()
		b.waitFor("Result's first read", func() bool { return reads.ended.Load() >= 1 })
		gate <- struct{}{}
		r := <-done
		if n >= 0 && (r.err != nil || r.out["n"] != n) {
			t.Fatalf("input %d: Result %v, %v; want n=%d", n, r.out, r.err, n)
		}
		var re *workflow.RunError
		if n < 0 && (!errors.As(r.err, &re) || re.State != workflow.StateFailed || re.Workflow != "delivered" || re.RunID != h.ID || re.Message == "") {
			t.Fatalf("input %d: Result %v, %v; want a *RunError of a failed run of delivered", n, r.out, r.err)
		}
		if got := reads.n.Load(); got != 1 {
			t.Fatalf("input %d: Result sent %d statements; want 1 (the read before waiting): the outcome recorded here was read again", n, got)
		}
		if n < 0 {
			var msg string
			if err := b.pool.QueryRow(ctx, `SELECT error FROM relay_workflow_runs WHERE id = $1 AND state = 'failed'`, h.ID).Scan(&msg); err != nil || msg != re.Message {
				t.Fatalf("the stored error %q (%v) is not Result's %q", msg, err, re.Message)
			}
		}
	}

	// Another registry's Handle (a process that only starts runs and
	// waits) is notified, and reads the outcome.
	other := workflow.NewRegistry(b.pool, nil)
	owf := workflow.MustRegister(other, "delivered", func(wctx workflow.Context, n int) (map[string]int, error) { return nil, nil })
	reads.reset()
	h, err := workflow.Start(ctx, b.pool, owf, 5, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var out map[string]int
	go func() {
		var err error
		out, err = h.Result(ctx, counted)
		done <- err
	}()
	b.waitFor("Result's first read", func() bool { return reads.ended.Load() >= 1 })
	gate <- struct{}{}
	if err := <-done; err != nil || out["n"] != 5 {
		t.Fatalf("Result on another registry: %v, %v", out, err)
	}
	if got := reads.n.Load(); got < 2 {
		t.Fatalf("Result on another registry sent %d statements; want a read before waiting and one after the notification", got)
	}
	other.Close()
}
