package bench_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/relayq/relay/bench"
	"github.com/relayq/relay/testkit/testdb"
)

// Relay's order check counts a keyed job whose handler started before its
// key's previous job's outcome committed, and only such a job: a real drain
// of keyed jobs has none, every handler start is reported through
// Hooks.KeyedStarted, and a start moved before the previous job's outcome,
// or one missing, is found.
func TestOrderViolationsFindsAnEarlyStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := testdb.New(t)
	r := bench.Relay{Keys: bench.NewCyclingKeyPicker(5)}
	if err := r.Setup(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const n = 60
	if err := r.InsertBatch(ctx, pool, n); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	starts := map[int64]int64{}
	all := make(chan struct{})
	var once sync.Once
	workCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		errc <- r.Work(workCtx, pool, bench.WorkerConfig{Workers: 8}, bench.Hooks{
			Started: func(int64) {},
			KeyedStarted: func(id int64, at time.Time) {
				mu.Lock()
				if _, ok := starts[id]; !ok {
					starts[id] = at.UnixMicro()
				}
				mu.Unlock()
			},
			Worked: func(time.Duration) {},
			Completed: func(total int64) {
				if total >= n {
					once.Do(func() { close(all) })
				}
			},
			Ready: func() {},
		})
	}()
	select {
	case <-all:
	case err := <-errc:
		t.Fatalf("work ended before the drain: %v", err)
	case <-ctx.Done():
		t.Fatal("the drain did not end")
	}
	stop()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	c, err := r.OrderViolations(ctx, pool, starts)
	if err != nil {
		t.Fatal(err)
	}
	if c.Jobs != 0 || c.Keys != 0 || c.Unreported != 0 {
		t.Fatalf("a drain of keyed jobs: %+v, want no violation and every start reported", c)
	}

	// The third job of key k0 (ids in insert order, keys in turn: ids
	// first, first+5, first+10) started 1 s before the second's outcome.
	var second, third, secondDoneUs int64
	if err := pool.QueryRow(ctx, `
		SELECT id, lead(id) OVER (ORDER BY id), (extract(epoch FROM finalized_at) * 1000000)::bigint
		FROM relay_jobs WHERE kind = 'bench' AND ordering_key = 'k0' ORDER BY id OFFSET 1 LIMIT 1`).Scan(&second, &third, &secondDoneUs); err != nil {
		t.Fatal(err)
	}
	early := map[int64]int64{}
	for id, us := range starts {
		early[id] = us
	}
	early[third] = secondDoneUs - 1_000_000
	if c, err := r.OrderViolations(ctx, pool, early); err != nil || c.Jobs != 1 || c.Keys != 1 || c.Unreported != 0 {
		t.Fatalf("job %d started before job %d finished: %+v, %v; want 1 job on 1 key", third, second, c, err)
	}
	delete(early, third)
	if c, err := r.OrderViolations(ctx, pool, early); err != nil || c.Jobs != 0 || c.Unreported != 1 {
		t.Fatalf("job %d's start not reported: %+v, %v; want 1 unreported, no violation", third, c, err)
	}
}
