package core

import (
	"context"
	"testing"
	"time"

	"github.com/relayq/relay/testkit/testdb"
)

// A one-slot queue's every claim that finds work is full, so it keeps a
// cursor and claims again when the job ends. Fed one job at a time, that
// claim finds nothing; it reads the priorities after the cursor's itself
// (walkClaimStatement), so no claim from the front follows it. Claims per
// job: the notification's and the one after the job, two; it was three.
// Polling is off, so no claim comes from the clock.
func TestOneSlotQueueClaimsTwicePerJob(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := NewWorkers()
	if err := AddWorker(ws, WorkFunc[floorArgs](func(context.Context, *Job[floorArgs]) error { return nil })); err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(pool, &Config{
		Workers:        ws,
		Queues:         map[string]QueueConfig{DefaultQueue: {MaxWorkers: 1}},
		PollInterval:   time.Hour,
		RescueInterval: -1,
		Retention:      Retention{Interval: -1},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Stop(ctx) //nolint:errcheck
	})
	waitUntil(t, "the client's listener", func() bool {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'relay-listener %' AND query LIKE 'LISTEN%'`).Scan(&n) //nolint:errcheck
		return n > 0
	})
	q := c.queues[DefaultQueue]
	waitUntil(t, "the fetch loop's first claim", func() bool { return c.stats.claims.Load() > 0 && q.active.Load() == 0 })
	const jobs = 20
	before := c.stats.claims.Load()
	for i := range jobs {
		if _, err := Enqueue(ctx, pool, floorArgs{}, nil); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the job to run", func() bool { return c.Stats().Succeeded == int64(i+1) })
		// The claim after the job is sent after its success is counted.
		waitUntil(t, "the fetch loop to settle", func() bool {
			return q.active.Load() == 0 && !q.more.Load()
		})
	}
	claims := c.stats.claims.Load() - before
	t.Logf("%d claims for %d jobs", claims, jobs)
	if claims > 2*jobs+2 {
		t.Fatalf("%d claims for %d jobs one at a time, want at most %d (two a job)", claims, jobs, 2*jobs+2)
	}
}
