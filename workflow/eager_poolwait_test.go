package workflow_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// A RunNow whose pool is exhausted (its handlers hold the connections)
// waits for a connection under its ctx: nothing has been sent, so nothing
// can have been written, and only the eager statement, once sent,
// outlives ctx (a hostile review found the wait under the statement's
// 15 s bound).
func TestEagerPoolWaitHonoursCtx(t *testing.T) {
	t.Parallel()
	direct := testdb.URL(t)
	pool, c, wf := eagerOnOnePool(t, direct+"&pool_max_conns=1", direct, "eager.poolwait")
	held, err := pool.Acquire(context.Background()) // a handler holding the pool's one connection
	if err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			held.Release()
		}
	}
	defer release()

	ctx, cancel := context.WithTimeout(callerCtx(t), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	began := time.Now()
	go func() {
		_, err := workflow.RunNow(ctx, c, wf, 1, &workflow.StartOpts{ID: "eager.poolwait"})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("RunNow: %v, want the caller's deadline", err)
		}
		t.Logf("RunNow returned after %v: %v", time.Since(began).Round(time.Millisecond), err)
	case <-time.After(3 * time.Second):
		release()
		err := <-done
		t.Errorf("RunNow with a 300 ms ctx still waiting for a pool connection after 3 s (returned %v after the connection was released: %v)",
			time.Since(began).Round(time.Millisecond), err)
	}
}

// A RunNow whose ctx is already cancelled writes nothing and says so.

// eagerOnOnePool starts a client of two slots on a pool of URL u (the
// workflow's connections and the client's), listening on direct, and
// registers workflow name (its input for output) on it; both end with
// the test.
func eagerOnOnePool(t *testing.T, u, direct, name string) (*pgxpool.Pool, *core.Client, *workflow.Workflow[int, int]) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	reg := workflow.NewRegistry(pool, nil)
	wf := workflow.MustRegister(reg, name, func(wctx workflow.Context, in int) (int, error) { return in, nil })
	ws := core.NewWorkers()
	if err := reg.AddWorkers(ws); err != nil {
		t.Fatal(err)
	}
	c, err := core.NewClient(pool, &core.Config{Workers: ws, ListenerURL: direct, PollInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Stop(sctx) //nolint:errcheck
	})
	return pool, c, wf
}
