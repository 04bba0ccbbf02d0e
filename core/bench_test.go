package core_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

func BenchmarkEnqueue(b *testing.B) {
	pool := testdb.New(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := core.Enqueue(ctx, pool, noopArgs{}, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEnqueueMany1000(b *testing.B) {
	pool := testdb.New(b)
	ctx := context.Background()
	params := make([]core.EnqueueParams, 1000)
	for i := range params {
		params[i] = core.EnqueueParams{Args: noopArgs{}}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "jobs/s")
}

// BenchmarkEnqueueKeyed enqueues one job at a time with an ordering key
// among 100: the keyed path of the ordering triggers (the cost on top of
// BenchmarkEnqueue).
func BenchmarkEnqueueKeyed(b *testing.B) {
	pool := testdb.New(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := core.Enqueue(ctx, pool, noopArgs{}, &core.EnqueueOpts{OrderingKey: fmt.Sprintf("k%d", i%100)}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnqueueManyKeyed1000 enqueues batches of 1,000 jobs spread over
// 50 ordering keys, as the outbox's dispatcher does.
func BenchmarkEnqueueManyKeyed1000(b *testing.B) {
	pool := testdb.New(b)
	ctx := context.Background()
	params := make([]core.EnqueueParams, 1000)
	for i := range params {
		params[i] = core.EnqueueParams{Args: noopArgs{}, Opts: &core.EnqueueOpts{OrderingKey: fmt.Sprintf("k%d", i%50)}}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "jobs/s")
}

// BenchmarkDrain: b.N no-op jobs pre-inserted, then worked by one client with
// 100 workers; reports worked jobs/s (claim + run + batched completion).
func BenchmarkDrain(b *testing.B) {
	pool := testdb.New(b)
	ctx := context.Background()
	for left := b.N; left > 0; left -= 5000 {
		params := make([]core.EnqueueParams, min(left, 5000))
		for i := range params {
			params[i] = core.EnqueueParams{Args: noopArgs{}}
		}
		if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
			b.Fatal(err)
		}
	}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[noopArgs](func(context.Context, *core.Job[noopArgs]) error { return nil }))
	c, err := core.NewClient(pool, &core.Config{Workers: ws, Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 100}}})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU(b)
	start := time.Now()
	c.Start(ctx)
	for c.Stats().Succeeded < int64(b.N) {
		time.Sleep(time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
	// The client's CPU per job (this process's; PostgreSQL runs in its
	// own): what relay bench reports as worker CPU, without a harness.
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/job")
	b.StopTimer()
	c.Stop(ctx)
}

// processCPU is the CPU time this process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPickupLatency: one job at a time into an idle client (polling
// effectively off, so LISTEN/NOTIFY does the waking); reports the mean time
// from calling Enqueue (so the commit is included) to the handler's start.
func BenchmarkPickupLatency(b *testing.B) {
	pool := testdb.New(b)
	ctx := context.Background()
	started := make(chan time.Time, 1)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[noopArgs](func(context.Context, *core.Job[noopArgs]) error {
		started <- time.Now()
		return nil
	}))
	c, err := core.NewClient(pool, &core.Config{Workers: ws, PollInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	c.Start(ctx)
	defer c.Stop(ctx)
	time.Sleep(100 * time.Millisecond) // let the listener connect before timing
	var total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		enqueued := time.Now()
		if _, err := core.Enqueue(ctx, pool, noopArgs{}, nil); err != nil {
			b.Fatal(err)
		}
		total += (<-started).Sub(enqueued)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "pickup-ms")
}
