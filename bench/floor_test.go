package bench_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/bench"
	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The floor drains what it is given, each job once, and records every
// completion it reports: a floor that lost or repeated jobs would measure
// less work than Relay does.
func TestFloorDrainsEachJobOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := testdb.New(t)
	var f bench.Floor
	if err := f.Setup(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	if err := f.InsertBatch(ctx, pool, n-1); err != nil {
		t.Fatal(err)
	}
	var started, completed atomic.Int64
	all := make(chan struct{})
	workCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		errc <- f.Work(workCtx, pool, bench.WorkerConfig{Workers: 16, Prefetch: 8}, bench.Hooks{
			Started: func(int64) { started.Add(1) },
			Worked:  func(time.Duration) {},
			Completed: func(total int64) {
				if completed.Swap(total) < n && total >= n {
					close(all)
				}
			},
			Ready: func() {},
		})
	}()
	// One job inserted while the worker listens: the notification, not a
	// poll, has it claimed (the test's bound is far above the 1 s poll only
	// to stay deterministic on a loaded machine).
	if err := f.InsertOne(ctx, pool, time.Now()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-all:
	case <-ctx.Done():
		t.Fatalf("the floor completed %d of %d jobs", completed.Load(), n)
	}
	stop()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	var done, other int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 2 AND lease_token IS NULL AND finalized_at IS NOT NULL),
		count(*) FILTER (WHERE state <> 2) FROM floor_jobs`).Scan(&done, &other); err != nil {
		t.Fatal(err)
	}
	if done != n || other != 0 || started.Load() != n || completed.Load() != n {
		t.Fatalf("succeeded rows %d, others %d, handlers started %d, completions reported %d; want %d, 0, %d, %d", done, other, started.Load(), completed.Load(), n, n, n)
	}
}
