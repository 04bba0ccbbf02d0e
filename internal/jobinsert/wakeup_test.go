package jobinsert

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/dbx"
	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Two enqueues on a pool that commit within DefaultWakeWindow of each
// other: the first wakes the workers at once, the second's wake-up is
// deferred, not dropped — it is sent after both returned, so that a claim
// made for the first cannot have missed the second's job.
func TestWakeupDeferredNotDropped(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	listen, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Release()
	if _, err := listen.Exec(ctx, `LISTEN relay_jobs`); err != nil {
		t.Fatal(err)
	}
	ex, err := dbx.For(pool)
	if err != nil {
		t.Fatal(err)
	}
	const queue = "wakeup-deferred"
	// At once, as two enqueues committing together do (one after the
	// other, the first's wake-up, sent before it returns, is older than
	// the window by the time the second comes).
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			Wake(ctx, pool, ex, []string{queue}, DefaultWakeWindow)
		}()
	}
	close(start)
	wg.Wait()
	returned := time.Now()
	var got []time.Time
	for len(got) < 2 {
		wait, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := listen.Conn().WaitForNotification(wait)
		cancel()
		if err != nil {
			t.Fatalf("%d wake-ups of %q arrived, want 2: %v", len(got), queue, err)
		}
		if n.Payload == queue {
			got = append(got, time.Now())
		}
	}
	if !got[1].After(returned) {
		t.Fatal("the second wake-up arrived before both wakeQueues returned: it was not deferred")
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

// A longer window defers a wake-up for its length, not 1 ms, and sends it
// then (bound and delivery); a caller with a shorter window, arriving
// meanwhile, brings it forward to its own bound; flushWakeups (a Client's
// Stop) sends what is scheduled at once.
func TestWakeupWindows(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ex, err := dbx.For(pool)
	if err != nil {
		t.Fatal(err)
	}
	const long = 4 * time.Second

	t.Run("long", func(t *testing.T) {
		const queue = "wake-long"
		next := wakeListener(t, pool, queue)
		Wake(ctx, pool, ex, []string{queue}, long)
		if err := next(10 * time.Second); err != nil {
			t.Fatalf("the first wake-up did not arrive: %v", err)
		}
		Wake(ctx, pool, ex, []string{queue}, long)
		// With a 1 ms window it would come a millisecond after the first.
		if err := next(time.Second); err == nil {
			t.Fatal("the second wake-up came within a second: not coalesced over the window")
		}
		if err := next(10 * time.Second); err != nil {
			t.Fatalf("the second wake-up never came: dropped (%v)", err)
		}
	})
	t.Run("shorter caller", func(t *testing.T) {
		const queue = "wake-mixed"
		next := wakeListener(t, pool, queue)
		Wake(ctx, pool, ex, []string{queue}, long)
		if err := next(10 * time.Second); err != nil {
			t.Fatalf("the first wake-up did not arrive: %v", err)
		}
		Wake(ctx, pool, ex, []string{queue}, long) // scheduled at +4 s
		Wake(ctx, pool, ex, []string{queue}, DefaultWakeWindow)
		if err := next(long / 2); err != nil {
			t.Fatalf("a 1 ms caller's wake-up waited for the longer window's: %v", err)
		}
	})
	t.Run("flush", func(t *testing.T) {
		const queue = "wake-flush"
		next := wakeListener(t, pool, queue)
		Wake(ctx, pool, ex, []string{queue}, long)
		if err := next(10 * time.Second); err != nil {
			t.Fatalf("the first wake-up did not arrive: %v", err)
		}
		Wake(ctx, pool, ex, []string{queue}, long)
		FlushWakeups(ctx, pool, ex)
		if err := next(long / 2); err != nil {
			t.Fatalf("a flushed wake-up was not sent at once: %v", err)
		}
	})
}
