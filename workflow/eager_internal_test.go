package workflow

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/jobinsert"
	"github.com/relayq/relay/testkit/testdb"
)

// The caller's process dies (kill -9) after sqlEagerStartClaimed
// committed and before Adopt: nobody holds the job, claimed by a client
// that is gone. Its lease expires, the rescuer requeues it (the attempt
// counted), and another client runs the run to its end, once.
func TestEagerCrashBeforeAdoptIsRescued(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reg := NewRegistry(pool, &Config{ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
	var ran atomic.Int32
	MustRegister(reg, "eager.crash", func(wctx Context, in int) (int, error) {
		return Step(wctx, "s", func(ctx context.Context) (int, error) { ran.Add(1); return in + 1, nil }, nil)
	})
	o, err := startDefaults("eager.crash", &StartOpts{ID: "crashed"})
	if err != nil {
		t.Fatal(err)
	}
	row, err := runJobRow(o, runJobMetadata(o.ID, map[string]string{}))
	if err != nil {
		t.Fatal(err)
	}
	job, err := jobinsert.BeginFor(ctx, row, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	var at *time.Time
	if err := pool.QueryRow(ctx, sqlEagerStartClaimed, o.ID, "eager.crash", "1", o.Queue, "{}",
		o.Tags, job.Param(), "dead-client", uuid.New().String(), int64(300)).Scan(&id, &at); err != nil {
		t.Fatal(err)
	}
	if at == nil {
		t.Fatal("inserted queued")
	}
	// The dead client's job as the database holds it: claimed, a lease.
	var state string
	var expires time.Time
	if err := pool.QueryRow(ctx, `SELECT state, lease_expires_at FROM relay_jobs WHERE id = $1`, id).Scan(&state, &expires); err != nil {
		t.Fatal(err)
	}
	if state != "claimed" || !expires.After(*at) {
		t.Fatalf("job %s, lease until %v (claimed at %v)", state, expires, *at)
	}
	ws := core.NewWorkers()
	if err := reg.AddWorkers(ws); err != nil {
		t.Fatal(err)
	}
	c, err := core.NewClient(pool, &core.Config{Workers: ws, RescueInterval: 50 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		c.Stop(sctx)
	}()
	out, err := Result[int](ctx, pool, "crashed")
	if err != nil || out != 2 {
		t.Fatalf("Result: %d, %v", out, err)
	}
	if ran.Load() != 1 {
		t.Fatalf("the step ran %d times", ran.Load())
	}
	var attempt int
	if err := pool.QueryRow(ctx, `SELECT attempt FROM relay_jobs WHERE id = $1`, id).Scan(&attempt); err != nil {
		t.Fatal(err)
	}
	if attempt != 2 {
		t.Fatalf("attempt %d, want 2 (the dead client's counted, then the rescued one)", attempt)
	}
}
