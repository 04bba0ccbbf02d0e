package core

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/relayq/relay/internal/testdb"
)

// Two enqueues on a pool that commit within enqueueWakeCoalesce of each
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
	ex, err := execerFor(pool)
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
			wakeQueues(ctx, pool, ex, []string{queue})
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
