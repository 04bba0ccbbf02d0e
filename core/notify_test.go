package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/testdb"
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
