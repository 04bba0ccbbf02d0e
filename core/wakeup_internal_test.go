package core

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/jobinsert"
	"github.com/relayq/relay/testkit/testdb"
)

// A Client's enqueues coalesce over its EnqueueWakeCoalesce (defaulted to
// the package-level 1 ms), and its Stop (of a client never started, here)
// sends what they left scheduled.
func TestClientEnqueueWakeWindow(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	for _, bad := range []time.Duration{-time.Millisecond, 2 * time.Second} {
		if _, err := NewClient(pool, &Config{EnqueueWakeCoalesce: bad}); err == nil {
			t.Errorf("EnqueueWakeCoalesce %s accepted", bad)
		}
	}
	def, err := NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := def.wakeWindow(); got != jobinsert.DefaultWakeWindow {
		t.Errorf("default wake window %s, want %s", got, jobinsert.DefaultWakeWindow)
	}
	const queue = "client-wake-window"
	next := wakeListener(t, pool, queue)
	c, err := NewClient(pool, &Config{EnqueueWakeCoalesce: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, floorArgs{}, &EnqueueOpts{Queue: queue}); err != nil {
		t.Fatal(err)
	}
	if err := next(10 * time.Second); err != nil {
		t.Fatalf("the first enqueue's wake-up did not arrive: %v", err)
	}
	if _, err := c.Enqueue(ctx, floorArgs{}, &EnqueueOpts{Queue: queue}); err != nil {
		t.Fatal(err)
	}
	window, left := jobinsert.Scheduled(pool, queue)
	if window != time.Second {
		t.Fatalf("the enqueue coalesced over %s, want the client's 1s", window)
	}
	if left < 700*time.Millisecond {
		t.Skipf("the second enqueue came %s into the window: too late to tell Stop's send from the timer's", time.Second-left)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Stop sent it: the timer's is still hundreds of milliseconds away.
	if err := next(left / 2); err != nil {
		t.Fatalf("Stop did not send the waiting wake-up: %v", err)
	}
}

// wakeListener is a connection of pool listening on relay_jobs, and a
// wait for the next wake-up of queue.
func wakeListener(t *testing.T, pool *pgxpool.Pool, queue string) func(within time.Duration) error {
	t.Helper()
	ctx := context.Background()
	listen, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		listen.Exec(context.Background(), `UNLISTEN *`) //nolint:errcheck // a connection that fails it is closed on release
		listen.Release()
	})
	if _, err := listen.Exec(ctx, `LISTEN relay_jobs`); err != nil {
		t.Fatal(err)
	}
	return func(within time.Duration) error {
		wait, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		for {
			n, err := listen.Conn().WaitForNotification(wait)
			if err != nil {
				return err
			}
			if n.Payload == queue {
				return nil
			}
		}
	}
}
