package core_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type drainArgs struct {
	Urgent bool `json:"urgent"`
}

func (drainArgs) Kind() string { return "drain" }

// While a drain claims full batches, each claim starts after the previous
// one's last job (skipping the dead entries claimed jobs leave in the claim
// index). A more urgent job enqueued meanwhile sorts before that cursor: its
// notification makes the next claim start over, so it runs next, not after
// the drain (polling is off here).
func TestUrgentJobDuringDrain(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	const drain = 4000
	params := make([]core.EnqueueParams, drain)
	for i := range params {
		params[i] = core.EnqueueParams{Args: drainArgs{}, Opts: &core.EnqueueOpts{Priority: new(5)}}
	}
	if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handled, urgentAt := 0, -1
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[drainArgs](func(ctx context.Context, j *core.Job[drainArgs]) error {
		mu.Lock()
		if j.Args.Urgent {
			urgentAt = handled
		}
		handled++
		mu.Unlock()
		time.Sleep(time.Millisecond) // a drain that lasts a few seconds
		return nil
	}))
	c := startClient(t, pool, &core.Config{Workers: ws, FetchLimit: 10, PollInterval: time.Hour,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 10}}})
	waitFor(t, "the drain to be under way", func() bool { mu.Lock(); defer mu.Unlock(); return handled >= 100 })
	if _, err := core.Enqueue(ctx, pool, drainArgs{Urgent: true}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "everything to run", func() bool { return c.Stats().Succeeded == drain+1 })
	mu.Lock()
	defer mu.Unlock()
	// Enqueued after about 100 jobs ran, it must run long before the drain
	// ends (without the rescan it runs last); the margin absorbs a loaded
	// machine's lag between the enqueue and the next claim.
	if urgentAt < 0 || urgentAt > drain-1000 {
		t.Fatalf("the urgent job ran as number %d of %d; want it soon after it was enqueued (about 100)", urgentAt, drain+1)
	}
}

// A drain's claims from its cursor stop at the end of the cursor's
// priority (walkClaimStatement); the next priority's jobs notify nobody
// again, so the claim that finds its priority's end is followed by one
// from the front at once. Polling is off here, and the jobs of priorities
// 1 to 3 are inserted behind the API, with no notification, once the
// client listens: one job enqueued through the API (priority 0) starts
// the drain. Without that claim the drain stopped after priority 1.
func TestDrainCrossesPriorities(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	const each = 40
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[drainArgs](func(ctx context.Context, j *core.Job[drainArgs]) error { return nil }))
	// One slot: a claim of one job is full, so every claim after the first
	// is from the cursor, and no other job's end wakes the fetch loop.
	c := startClient(t, pool, &core.Config{Workers: ws, PollInterval: time.Hour,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	// Listening: a job enqueued now is claimed on its notification.
	if _, err := core.Enqueue(ctx, pool, drainArgs{}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first job to run", func() bool { return c.Stats().Succeeded == 1 })
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, priority)
		SELECT 'drain', p FROM generate_series(1, 3) AS p, generate_series(1, $1) AS i`, each); err != nil {
		t.Fatal(err)
	}
	if _, err := core.Enqueue(ctx, pool, drainArgs{}, &core.EnqueueOpts{Priority: new(0)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every priority's jobs to run", func() bool { return c.Stats().Succeeded == 2+3*each })
}
