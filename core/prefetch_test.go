package core_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type holdArgs struct {
	N int `json:"n"`
}

func (holdArgs) Kind() string { return "hold" }

// With one worker and Prefetch 1, a second job is claimed while the first
// runs, but never runs beside it; when the client stops before its turn,
// the prefetched job goes back to the queue with its attempt uncounted.
func TestPrefetch(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	release := make(chan struct{})
	var running, maxRunning atomic.Int32
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[holdArgs](func(ctx context.Context, j *core.Job[holdArgs]) error {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			m := maxRunning.Load()
			if n <= m || maxRunning.CompareAndSwap(m, n) {
				break
			}
		}
		select {
		case <-release:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		return nil
	}))
	c, err := core.NewClient(pool, &core.Config{Workers: ws,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1, Prefetch: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for i := range 3 {
		res, err := core.Enqueue(ctx, pool, holdArgs{N: i}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "one running and one prefetched", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_jobs WHERE state = 'claimed'`) == 2 && running.Load() == 1
	})
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE state = 'queued'`); n != 1 {
		t.Fatalf("%d jobs still queued, want 1 (max 1 + prefetch 1 claimed)", n)
	}
	release <- struct{}{} // the first job finishes; the prefetched one starts
	waitFor(t, "the first success", func() bool { return c.Stats().Succeeded == 1 })
	waitFor(t, "the prefetched job to start and the third to be prefetched", func() bool {
		return running.Load() == 1 && count(t, pool, `SELECT count(*) FROM relay_jobs WHERE state = 'claimed'`) == 2
	})

	// Stop while job 2 runs and job 3 waits: job 3 goes back at once. Job 2
	// runs until cancelled, so the stop's length does not matter, but Stop
	// keeps its last quarter (at most 2s) to record the releases: 50ms of a
	// 200ms stop, and 1s of a 4s one, were missed on a loaded machine,
	// leaving job 2 claimed.
	stopCtx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	c.Stop(stopCtx)
	if maxRunning.Load() != 1 {
		t.Errorf("%d jobs ran at once with MaxWorkers 1", maxRunning.Load())
	}
	// Claim order holds: the first job ran first, the second was running
	// and was interrupted, the third was still waiting.
	if s := jobState(t, pool, ids[0]); s != core.StateSucceeded {
		t.Errorf("first job is %s, want succeeded (prefetched jobs run in claim order)", s)
	}
	for _, id := range ids[1:] {
		var state string
		var attempt int
		if err := pool.QueryRow(ctx, `SELECT state, attempt FROM relay_jobs WHERE id = $1`, id).Scan(&state, &attempt); err != nil {
			t.Fatal(err)
		}
		if state != "queued" || attempt != 0 {
			t.Errorf("job %d after stop: %s, attempt %d; want queued with the attempt uncounted", id, state, attempt)
		}
	}
}

// goroutineID parses the running goroutine's id from its stack header
// ("goroutine 42 [running]:").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := strings.Cut(strings.TrimPrefix(string(buf), "goroutine "), " ")
	return id
}

type whereArgs struct{}

func (whereArgs) Kind() string { return "where" }

// Jobs run on parked executor goroutines, not on a fresh goroutine each
// (whose stack would grow again on every job): 30 jobs enqueued one after
// another on a queue of 3 workers run on at most 3 goroutines. Stop ends
// those goroutines.
func TestExecutorsAreReused(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	var mu sync.Mutex
	seen := map[string]int{}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[whereArgs](func(ctx context.Context, j *core.Job[whereArgs]) error {
		mu.Lock()
		seen[goroutineID()]++
		mu.Unlock()
		return nil
	}))
	c, err := core.NewClient(pool, &core.Config{Workers: ws,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	const jobs = 30
	for i := range jobs {
		if _, err := core.Enqueue(ctx, pool, whereArgs{}, nil); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the job to succeed", func() bool { return c.Stats().Succeeded == int64(i+1) })
	}
	mu.Lock()
	executors := len(seen)
	mu.Unlock()
	if executors > 3 {
		t.Errorf("%d jobs ran on %d goroutines, want at most 3 (one per slot): %v", jobs, executors, seen)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the executors to exit", func() bool {
		buf := make([]byte, 1<<20)
		all := string(buf[:runtime.Stack(buf, true)])
		for id := range seen {
			if strings.Contains(all, "goroutine "+id+" [") {
				return false
			}
		}
		return true
	})
}
