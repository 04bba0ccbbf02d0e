package core_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

// A caller's transaction holding one running job's row lock for longer
// than the lease stalls neither the other jobs' heartbeats nor the
// recording of their outcomes: none of them is rescued, and a success is
// written while the lock is held. The locked job itself misses its
// renewals, and its handler is cancelled at its local lease deadline.
func TestCallerRowLockStallsNoOtherLease(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	h, ws := newHolder()
	// Generous: the unrelated job must keep its lease for two leases, and
	// each heartbeat is bounded by 40% of the lease; with 2s, two heartbeats
	// in a row slower than 800ms on a loaded machine would cancel it.
	lease := 3 * time.Second
	c := startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: lease, RescueInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 3}}})
	var ids []int64
	for i := range 3 {
		res, err := core.Enqueue(ctx, pool, heldArgs{N: i}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	for range 3 {
		<-h.started
	}
	locked, done, other := ids[0], ids[1], ids[2]

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var lockedAt time.Time
	if err := tx.QueryRow(ctx, `SELECT now() FROM relay_jobs WHERE id = $1 FOR UPDATE`, locked).Scan(&lockedAt); err != nil {
		t.Fatal(err)
	}
	// A success while the lock is held is written at once.
	h.ch(done) <- nil
	waitState(t, pool, done, core.StateSucceeded)
	// Hold the lock for two leases.
	waitDBTime(t, pool, lockedAt.Add(2*lease))
	j, err := core.JobGet(ctx, pool, other)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != core.StateClaimed || j.Attempt != 1 || len(j.History) != 0 {
		t.Fatalf("an unrelated job was disturbed by the caller's lock: %+v", j)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE id = $1 AND lease_expires_at > now()`, other); n != 1 {
		t.Fatal("the unrelated job's lease was not renewed")
	}
	if _, ok := h.ended(other); ok {
		t.Fatal("the unrelated job's handler was cancelled")
	}
	waitFor(t, "the locked job's handler cancelled", func() bool { _, ok := h.ended(locked); return ok })
	if e, _ := h.ended(locked); !errors.Is(e.cause, core.ErrLeaseLost) {
		t.Fatalf("locked job's handler ended with %v, want ErrLeaseLost", e.cause)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	h.ch(other) <- nil
	waitState(t, pool, other, core.StateSucceeded)
	if s := c.Stats(); s.LeaseLost != 1 {
		t.Fatalf("LeaseLost = %d, want 1 (the locked job, counted once)", s.LeaseLost)
	}
}

// A client cut off from the database cancels its handlers (cause
// ErrLeaseLost) before their leases expire in the database, so no other
// worker can claim a job while its first handler still runs.
func TestLocalLeaseDeadline(t *testing.T) {
	t.Parallel()
	pool, direct, proxy := proxied(t, 0)
	ctx := context.Background()
	h, ws := newHolder()
	// The local deadline comes a fifth of the lease before the expiry in
	// the database: 1s for the cancel to reach the handler on a loaded
	// machine (600ms with 3s, which a descheduled goroutine can use up).
	lease := 5 * time.Second
	c := startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: lease, RescueInterval: -1})
	res, err := core.Enqueue(ctx, direct, heldArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-h.started
	proxy.Cut()
	waitFor(t, "handler cancelled", func() bool { _, ok := h.ended(res.ID); return ok })
	e, _ := h.ended(res.ID)
	if !errors.Is(e.cause, core.ErrLeaseLost) {
		t.Fatalf("handler ended with %v, want ErrLeaseLost", e.cause)
	}
	var expires time.Time
	if err := direct.QueryRow(ctx, `SELECT lease_expires_at FROM relay_jobs WHERE id = $1`, res.ID).Scan(&expires); err != nil {
		t.Fatal(err)
	}
	if !e.at.Before(expires) {
		t.Fatalf("handler cancelled at %s, after its lease expired in the database at %s", e.at, expires)
	}
	proxy.Restore()
	if s := c.Stats(); s.LeaseLost != 1 {
		t.Fatalf("LeaseLost = %d, want 1", s.LeaseLost)
	}
}

// Handlers holding every connection of the caller's pool (a transaction
// each, the CompleteTx pattern) starve neither heartbeats nor claims: the
// client's bookkeeping has connections of its own.
func TestHandlersHoldingThePoolStarveNoLease(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := context.Background()
	// Generous: no lease may be lost, and each heartbeat is bounded by 40%
	// of the lease; with 2s, two heartbeats in a row slower than 800ms on a
	// loaded machine would cancel a handler.
	lease := 3 * time.Second
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[heldArgs](func(ctx context.Context, j *core.Job[heldArgs]) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		// Hold the transaction (and the connection) for longer than the
		// lease; pg_sleep keeps it busy in the database too.
		if _, err := tx.Exec(ctx, `SELECT pg_sleep(3.5)`); err != nil {
			return err
		}
		if err := core.CompleteTx(ctx, tx, j); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}))
	c := startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: lease, RescueInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 4}}})
	var params []core.EnqueueParams
	for i := range 8 {
		params = append(params, core.EnqueueParams{Args: heldArgs{N: i}})
	}
	if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every job succeeded", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_jobs WHERE state = 'succeeded'`) == 8
	})
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE attempt <> 1 OR history <> '[]'`); n != 0 {
		t.Fatalf("%d jobs were rescued or retried", n)
	}
	if s := c.Stats(); s.LeaseLost != 0 || s.Rescued != 0 {
		t.Fatalf("stats %+v: leases lost under a pool held by handlers", s)
	}
}

// Failures are written in batches like successes: a hundred jobs failing
// together are recorded by a few transactions (rows written by one
// statement share their xmin), each with its own error, history and retry.
func TestFailuresAreBatched(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	const n = 100
	var started sync.WaitGroup
	started.Add(n)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[stormArgs](func(ctx context.Context, j *core.Job[stormArgs]) error {
		started.Done()
		started.Wait() // all fail together
		if j.Args.N%2 == 0 {
			return core.Permanent(fmt.Errorf("storm %d", j.Args.N))
		}
		return core.RetryIn(time.Hour, fmt.Errorf("storm %d", j.Args.N))
	}))
	c := startClient(t, pool, &core.Config{Workers: ws, Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: n}}})
	var params []core.EnqueueParams
	for i := range n {
		params = append(params, core.EnqueueParams{Args: stormArgs{N: i}})
	}
	if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every failure recorded", func() bool { s := c.Stats(); return s.Dead+s.Retried == n })
	if bad := count(t, pool, `SELECT count(*) FROM relay_jobs
		WHERE last_error <> 'permanent: storm ' || (args->>'N') AND last_error <> 'storm ' || (args->>'N')
		   OR jsonb_array_length(history) <> 1
		   OR state <> CASE WHEN (args->>'N')::int % 2 = 0 THEN 'dead' ELSE 'queued' END
		   OR (state = 'queued' AND run_at < now() + interval '59 minutes')`); bad != 0 {
		t.Fatalf("%d failures recorded wrong", bad)
	}
	if txs := count(t, pool, `SELECT count(DISTINCT xmin::text) FROM relay_jobs`); txs > n/4 {
		t.Fatalf("%d failures took %d transactions: not batched", n, txs)
	}
}

// After CompleteTx commits, the heartbeats until the handler returns count
// no lost lease and do not cancel the handler.
func TestCompleteTxThenHeartbeats(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	// Long enough that, until CompleteTx commits, the heartbeats (each
	// bounded by 40% of the lease) keep the lease on a loaded machine: with
	// 500ms, a claim, a transaction and a commit under the race detector
	// could pass the local deadline (400ms) and cancel the handler. Should
	// an attempt still lose its lease before CompleteTx, it fails and the
	// job runs again: the claim is about the attempt that committed.
	lease := 2 * time.Second
	committed, proceed := make(chan struct{}, 1), make(chan struct{})
	cancelled := make(chan error, 1)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[heldArgs](func(ctx context.Context, j *core.Job[heldArgs]) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.Background()) // a no-op after the commit
		if err := core.CompleteTx(ctx, tx, j); err != nil {
			return err
		}
		var committedAt time.Time
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&committedAt); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		committed <- struct{}{}
		select {
		case <-proceed:
		case <-ctx.Done(): // the test failed and stops the client
			return nil
		}
		// Go on for three leases: many heartbeats, and the local deadline.
		waitDBTime(t, pool, committedAt.Add(3*lease))
		cancelled <- context.Cause(ctx)
		return nil
	}))
	c := startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: lease})
	res, err := core.Enqueue(ctx, pool, heldArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-committed:
	case <-time.After(60 * time.Second):
		t.Fatal("no attempt committed its CompleteTx")
	}
	lostBefore := c.Stats().LeaseLost // by earlier attempts, if any
	close(proceed)
	select {
	case cause := <-cancelled:
		if cause != nil {
			t.Fatalf("the successful handler's context was cancelled: %v", cause)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the handler did not finish")
	}
	waitFor(t, "success counted", func() bool { return c.Stats().Succeeded == 1 })
	if s := c.Stats(); s.LeaseLost != lostBefore {
		t.Fatalf("LeaseLost = %d after a CompleteTx success (%d before it)", s.LeaseLost, lostBefore)
	}
	if st := jobState(t, pool, res.ID); st != core.StateSucceeded {
		t.Fatalf("state %s", st)
	}
}

// A client of many queues shares a bounded number of bookkeeping
// connections between their claims: with one per queue, a process serving
// hundreds of queues opened more connections than the server allows and
// every claim failed. 60 queues, each claiming a job at once, open at
// most 1 + 16 (before the bound: about 60).
func TestManyQueuesShareClaimConnections(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	const queues = 60
	var mu sync.Mutex
	ran := map[string]bool{}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		mu.Lock()
		ran[j.Args.Msg] = true
		mu.Unlock()
		return nil
	}))
	qs := map[string]core.QueueConfig{}
	params := make([]core.EnqueueParams, 0, queues)
	for i := range queues {
		name := fmt.Sprintf("q%d", i)
		qs[name] = core.QueueConfig{MaxWorkers: 1}
		params = append(params, core.EnqueueParams{Args: echoArgs{Msg: name}, Opts: &core.EnqueueOpts{Queue: name}})
	}
	// The jobs are there before the client starts: every queue's first
	// claim, at its start, finds one, all at once.
	if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
		t.Fatal(err)
	}
	c := startClient(t, pool, &core.Config{Workers: ws, ID: "many-queues", Queues: qs})
	waitFor(t, "a job of every queue run", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_jobs WHERE state = 'succeeded'`) == queues
	})
	mu.Lock()
	if len(ran) != queues {
		t.Errorf("%d queues' jobs ran, want %d", len(ran), queues)
	}
	mu.Unlock()
	// A pool keeps the connections it opened (idle, for 30 minutes): what
	// is there now is what the claims needed at most.
	n := count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, "relay-worker "+c.ID())
	if n > 1+16 {
		t.Errorf("the client of %d queues has %d bookkeeping connections, want at most 17", queues, n)
	}
	t.Logf("%d queues: %d bookkeeping connections", queues, n)
}
