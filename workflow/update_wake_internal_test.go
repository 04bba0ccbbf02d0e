package workflow

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

// outcomeReads counts a pool's reads of an update's outcome (UpdateResult's
// polls), each sent on reads once it has returned.
type outcomeReads struct{ reads chan struct{} }

func (o *outcomeReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == sqlUpdateOutcome {
		return context.WithValue(ctx, o, true)
	}
	return ctx
}

func (o *outcomeReads) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(o) != nil {
		o.reads <- struct{}{}
	}
}

// updateWakeBundle is a run waiting for its "go" signal before it handles
// update "set", then for its "end" signal, executed by a client on pool, and a second pool whose
// reads of an update's outcome are counted (UpdateResult reads through
// it).
type updateWakeBundle struct {
	pool   *pgxpool.Pool
	reader *pgxpool.Pool
	reads  chan struct{}
	reg    *Registry
	runID  string
}

func setupUpdateWake(t *testing.T, poll time.Duration) *updateWakeBundle {
	t.Helper()
	ctx := context.Background()
	url := testdb.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	tr := &outcomeReads{reads: make(chan struct{}, 100)}
	cfg.ConnConfig.Tracer = tr
	reader, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reader.Close)
	reg := NewRegistry(pool, &Config{ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
	reg.updatePoll = poll
	t.Cleanup(reg.Close)
	wf := MustRegister(reg, "update-wake", func(wctx Context, _ int) (string, error) {
		if _, _, err := WaitSignal[string](wctx, "go", 0); err != nil {
			return "", err
		}
		var got string
		if _, err := HandleUpdate(wctx, "set", func(_ Context, v string) (string, error) {
			got = v
			return "set " + v, nil
		}, nil); err != nil {
			return "", err
		}
		// Running on after the update, so that only the answer's
		// notification can wake its caller, not the run's end.
		_, _, err := WaitSignal[string](wctx, "end", 0)
		return got, err
	})
	ws := core.NewWorkers()
	if err := reg.AddWorkers(ws); err != nil {
		t.Fatal(err)
	}
	client, err := core.NewClient(pool, &core.Config{Workers: ws, PollInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		client.Stop(stop) //nolint:errcheck
	})
	h, err := Start(ctx, pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &updateWakeBundle{pool: pool, reader: reader, reads: tr.reads, reg: reg, runID: h.ID}
}

// awaitReads waits (bounded) for n more reads of an update's outcome.
func (b *updateWakeBundle) awaitReads(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-b.reads:
		case <-time.After(30 * time.Second):
			t.Fatal("UpdateResult did not read the update")
		}
	}
}

// UpdateResult waiting on the registry's listener, with its fallback poll
// an hour away, gets its answer from the notification the answering
// worker sends after its commit: it read the update twice while pending
// (once to learn its run, once subscribed to the run's end too), then once
// more, woken, and found the answer.
func TestUpdateResultWakesOnTheNotification(t *testing.T) {
	b := setupUpdateWake(t, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	uid, err := SendUpdate(ctx, b.pool, b.runID, "set", "x")
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		resp string
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := UpdateResult[string](ctx, b.reader, b.reg, uid)
		got <- answer{resp, err}
	}()
	b.awaitReads(t, 2)
	// Both reads found it pending: the run waits for "go" first.
	if err := Signal(ctx, b.pool, b.runID, "go", "now"); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-got:
		if a.err != nil || a.resp != "set x" {
			t.Fatalf("UpdateResult: %q, %v", a.resp, a.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("UpdateResult was not woken by the answer's notification (its poll is an hour away)")
	}
	if n := len(b.reads); n != 1 {
		t.Errorf("%d reads after the two while pending, want 1 (the one its notification woke)", n)
	}
	if err := Signal(ctx, b.pool, b.runID, "end", "now"); err != nil {
		t.Fatal(err)
	}
	if out, err := Result[string](ctx, b.pool, b.runID); err != nil || out != "x" {
		t.Fatalf("run: %q, %v", out, err)
	}
}

// A notification missed (the answer committed and its worker killed before
// announcing it, as here where the answer is written by hand) is caught by
// UpdateResult's fallback poll.
func TestUpdateResultPollsForAMissedNotification(t *testing.T) {
	b := setupUpdateWake(t, 50*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	uid, err := SendUpdate(ctx, b.pool, b.runID, "set", "x")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var resp string
	go func() {
		var err error
		resp, err = UpdateResult[string](ctx, b.reader, b.reg, uid)
		got <- err
	}()
	b.awaitReads(t, 2)
	if _, err := b.pool.Exec(ctx, `UPDATE relay_workflow_updates SET state = 'completed', response = '"by hand"', handled_at = now() WHERE id = $1`, uid); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil || resp != "by hand" {
			t.Fatalf("UpdateResult: %q, %v", resp, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("UpdateResult's poll did not catch the answer written without a notification")
	}
}

// The run's end, announced on the listener, wakes an UpdateResult waiting
// for an update no HandleUpdate will take (its poll an hour away), with
// ErrUpdateNotHandled.
func TestUpdateResultWakesOnTheRunsEnd(t *testing.T) {
	b := setupUpdateWake(t, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	uid, err := SendUpdate(ctx, b.pool, b.runID, "other", "x")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := UpdateResult[string](ctx, b.reader, b.reg, uid)
		got <- err
	}()
	b.awaitReads(t, 2)
	if err := Signal(ctx, b.pool, b.runID, "go", "now"); err != nil {
		t.Fatal(err)
	}
	if _, err := SendUpdate(ctx, b.pool, b.runID, "set", "y"); err != nil {
		t.Fatal(err)
	}
	if err := Signal(ctx, b.pool, b.runID, "end", "now"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, ErrUpdateNotHandled) {
			t.Fatalf("UpdateResult: %v, want ErrUpdateNotHandled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("UpdateResult was not woken by its run's end (its poll is an hour away)")
	}
}
