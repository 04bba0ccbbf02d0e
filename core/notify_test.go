package core_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

// With polling effectively off, only LISTEN/NOTIFY can wake the client: a
// job is picked up, then again after the listener's connection is killed
// (the client reconnects by itself).
func TestNotifyWakesAndListenerReconnects(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ran := make(chan int64, 10)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		ran <- j.ID
		return nil
	}))
	c := startClient(t, pool, &core.Config{Workers: ws, PollInterval: time.Hour})
	listenerPID := func() int {
		var pid int
		pool.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE application_name = $1 AND query LIKE 'LISTEN%'`, "relay-listener "+c.ID()).Scan(&pid)
		return pid
	}
	var first int
	waitFor(t, "listener connected", func() bool { first = listenerPID(); return first != 0 })

	res, _ := core.Enqueue(ctx, pool, echoArgs{}, nil)
	if id := <-ran; id != res.ID {
		t.Fatalf("ran %d, want %d", id, res.ID)
	}

	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, first); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "listener reconnected", func() bool { p := listenerPID(); return p != 0 && p != first })
	res, _ = core.Enqueue(ctx, pool, echoArgs{}, nil)
	if id := <-ran; id != res.ID {
		t.Fatalf("ran %d, want %d", id, res.ID)
	}

	// A job enqueued in a transaction wakes nobody until commit, and a rolled
	// back one never.
	tx, _ := pool.Begin(ctx)
	core.Enqueue(ctx, tx, echoArgs{}, nil)
	tx.Rollback(ctx)
	tx, _ = pool.Begin(ctx)
	res, _ = core.Enqueue(ctx, tx, echoArgs{}, nil)
	tx.Commit(ctx)
	if id := <-ran; id != res.ID {
		t.Fatalf("ran %d, want %d", id, res.ID)
	}
}

// A cancel notification names the attempt it cancels: one about an earlier
// attempt of the job leaves the running attempt alone.
func TestStaleCancelNotificationIgnored(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	h, ws := newHolder()
	startClient(t, pool, &core.Config{Workers: ws})
	res, err := core.Enqueue(ctx, pool, heldArgs{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-h.started
	if _, err := pool.Exec(ctx, `SELECT pg_notify('relay_control', 'cancel:' || $1::text || ':' || gen_random_uuid()::text)`, strconv.FormatInt(res.ID, 10)); err != nil {
		t.Fatal(err)
	}
	// Notifications arrive in order: once a later job has started, the
	// stale cancel has been handled.
	if _, err := core.Enqueue(ctx, pool, heldArgs{N: 2}, nil); err != nil {
		t.Fatal(err)
	}
	second := <-h.started
	if _, ok := h.ended(res.ID); ok {
		t.Fatal("a stale cancel notification cancelled the running attempt")
	}
	if err := core.Cancel(ctx, pool, res.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the current cancel to reach the handler", func() bool { _, ok := h.ended(res.ID); return ok })
	if e, _ := h.ended(res.ID); !errors.Is(e.cause, core.ErrJobCancelled) {
		t.Fatalf("cause %v, want ErrJobCancelled", e.cause)
	}
	h.ch(second) <- nil
}

// A retry without delay and a job released by a stopping client wake the
// queue's workers: with a poll of an hour, nothing else would.
func TestRetriesAndReleasesWakeTheQueue(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[flakyArgs](func(ctx context.Context, j *core.Job[flakyArgs]) error {
		if j.Attempt == 1 {
			return core.RetryIn(0, errors.New("again at once"))
		}
		return nil
	}))
	startClient(t, pool, &core.Config{Workers: ws, PollInterval: time.Hour})
	res, err := core.Enqueue(ctx, pool, flakyArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if j := waitState(t, pool, res.ID, core.StateSucceeded); j.Attempt != 2 {
		t.Fatalf("attempt %d", j.Attempt)
	}

	// A holds a job and stops; B, started after the claim and polling once
	// an hour, hears of the release.
	pool2 := testdb.New(t)
	h, wsA := newHolder()
	a, err := core.NewClient(pool2, &core.Config{Workers: wsA, // one slot, held: the probe below is B's
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // a no-op once stopped below
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.Stop(ctx)
	})
	held, err := core.Enqueue(ctx, pool2, heldArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-h.started
	wsB := core.NewWorkers()
	core.MustAddWorker(wsB, core.WorkFunc[heldArgs](func(ctx context.Context, j *core.Job[heldArgs]) error { return nil }))
	b := startClient(t, pool2, &core.Config{Workers: wsB, PollInterval: time.Hour})
	// Once B has run a probe job, it waits for a notification (or its poll).
	probe, err := core.Enqueue(ctx, pool2, heldArgs{N: 99}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, pool2, probe.ID, core.StateSucceeded)
	// The last quarter of Stop's time (at most 2s) records the release:
	// the 500ms of a 2s stop may not be enough on a loaded machine.
	stopCtx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	if err := a.Stop(stopCtx); err != nil {
		var se *core.StopError
		if !errors.As(err, &se) || se.Unrecorded != 0 {
			t.Fatalf("stop: %v", err)
		}
	}
	if j := waitState(t, pool2, held.ID, core.StateSucceeded); j.AttemptedBy != b.ID() {
		t.Fatalf("released job run by %s, want B", j.AttemptedBy)
	}
}
