package core_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
)

type chargeArgs struct {
	OrderID int64 `json:"order_id"`
}

func (chargeArgs) Kind() string { return "payment.charge" }

// Middleware wraps every handler of a Workers set; OnError reports every
// failed attempt, panics included.
func ExampleWorkers_Use() {
	ws := core.NewWorkers()
	ws.Use(
		core.OnError(func(ctx context.Context, job *core.JobRow, err error) {
			var p *core.PanicError
			if errors.As(err, &p) {
				slog.Error("job panicked", "job_id", job.ID, "value", p.Value)
				return
			}
			slog.Warn("job failed", "job_id", job.ID, "kind", job.Kind, "error", err)
		}),
		func(ctx context.Context, job *core.JobRow, next func(context.Context) error) error {
			began := time.Now()
			err := next(ctx)
			slog.Info("attempt", "job_id", job.ID, "took", time.Since(began), "ok", err == nil)
			return err
		},
	)
	core.MustAddWorker(ws, core.WorkFunc[chargeArgs](func(ctx context.Context, j *core.Job[chargeArgs]) error {
		return nil
	}))
}

// At most ten charges at once and a hundred starts a second, however many
// processes run workers.
func ExampleSetLimit() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres:///app")
	if err != nil {
		return
	}
	defer pool.Close()
	err = core.SetLimit(ctx, pool, core.Limit{Kind: "payment.charge", MaxRunning: 10, Rate: 100, Per: time.Second})
	fmt.Println(err)
}

// Tagged jobs, listed by tag.
func ExampleJobList() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres:///app")
	if err != nil {
		return
	}
	defer pool.Close()
	core.Enqueue(ctx, pool, chargeArgs{OrderID: 7}, &core.EnqueueOpts{Tags: []string{"tenant:acme"}, Priority: new(0)})
	jobs, err := core.JobList(ctx, pool, &core.JobListParams{
		Tags:   []string{"tenant:acme"},
		States: []core.JobState{core.StateDead},
	})
	for _, j := range jobs {
		fmt.Println(j.ID, j.Kind, j.LastError)
	}
}
