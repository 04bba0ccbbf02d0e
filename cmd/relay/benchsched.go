package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/scheduler"
)

// benchSchedArgs is the job a bench schedule fires: of a kind, and in a
// queue, that no bench worker serves, so that its fires cost the scheduler's
// statements and the enqueue, nothing else.
type benchSchedArgs struct{}

func (benchSchedArgs) Kind() string { return "bench.sched" }

// startBenchSchedules runs a scheduler on pool with n schedules, each
// firing every minute, until the returned stop is called.
func startBenchSchedules(ctx context.Context, pool *pgxpool.Pool, n int) (stop func(), err error) {
	scheds := make([]scheduler.Schedule, n)
	for i := range scheds {
		scheds[i] = scheduler.Schedule{Name: fmt.Sprintf("bench-%d", i), Spec: "* * * * *",
			Args: benchSchedArgs{}, Opts: &core.EnqueueOpts{Queue: "bench-sched"}}
	}
	s, err := scheduler.New(pool, &scheduler.Config{Schedules: scheds, Namespace: "bench", Logger: demoQuiet()})
	if err != nil {
		return nil, fmt.Errorf("schedules: %w", err)
	}
	if err := s.Start(ctx); err != nil {
		return nil, fmt.Errorf("schedules: %w", err)
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Stop(sctx); err != nil {
			fmt.Printf("bench: stop the scheduler: %v\n", err)
		}
	}, nil
}
