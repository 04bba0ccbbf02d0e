package core_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/netfault"
	"github.com/relayq/relay/internal/testdb"
)

type heldArgs struct{ N int }

func (heldArgs) Kind() string { return "held" }

// holder runs heldArgs jobs that each wait until released by job id or
// until their context ends; ends records each job's context cause (nil
// when released) and when it came.
type holder struct {
	started chan int64
	mu      sync.Mutex
	release map[int64]chan error
	ends    map[int64]holderEnd
}

type holderEnd struct {
	cause error
	at    time.Time
}

func newHolder() (*holder, *core.Workers) {
	h := &holder{started: make(chan int64, 100), release: map[int64]chan error{}, ends: map[int64]holderEnd{}}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[heldArgs](func(ctx context.Context, j *core.Job[heldArgs]) error {
		ch := h.ch(j.ID)
		h.started <- j.ID
		select {
		case err := <-ch:
			h.end(j.ID, nil)
			return err
		case <-ctx.Done():
			h.end(j.ID, context.Cause(ctx))
			return ctx.Err()
		}
	}))
	return h, ws
}

func (h *holder) ch(id int64) chan error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.release[id] == nil {
		h.release[id] = make(chan error, 1)
	}
	return h.release[id]
}

func (h *holder) end(id int64, cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ends[id] = holderEnd{cause, time.Now()}
}

func (h *holder) ended(id int64) (holderEnd, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.ends[id]
	return e, ok
}

// proxied returns a pool on a fresh database reached through a proxy the
// test can cut.
func proxied(t *testing.T, maxConns int32) (*pgxpool.Pool, *pgxpool.Pool, *netfault.Proxy) {
	t.Helper()
	url := testdb.URL(t)
	direct, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := netfault.Listen(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	host, port, _ := net.SplitHostPort(p.Addr())
	n, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, direct, p
}

// waitDBTime waits until the database's clock passes t.
func waitDBTime(t *testing.T, pool *pgxpool.Pool, at time.Time) {
	t.Helper()
	waitFor(t, "database time "+at.Format(time.RFC3339Nano), func() bool {
		var past bool
		if err := pool.QueryRow(context.Background(), `SELECT now() > $1`, at).Scan(&past); err != nil {
			t.Fatal(err)
		}
		return past
	})
}

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

// Enqueueing a duplicate of a running unique job in a transaction takes no
// lock on the running job's row.
func TestDuplicateEnqueueLocksNothing(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	opts := &core.EnqueueOpts{Unique: &core.UniqueOpts{Key: "k"}}
	first, err := core.Enqueue(ctx, pool, heldArgs{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'claimed', attempt = 1, lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute' WHERE id = $1`, first.ID); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	dup, err := core.EnqueueMany(ctx, tx, []core.EnqueueParams{
		{Args: heldArgs{N: 1}, Opts: opts},
		{Args: heldArgs{N: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !dup[0].Duplicate || dup[0].ID != first.ID || dup[1].Duplicate || dup[1].ID == 0 {
		t.Fatalf("results %+v, want a duplicate of %d and a new job", dup, first.ID)
	}
	if _, err := pool.Exec(ctx, `SELECT 1 FROM relay_jobs WHERE id = $1 FOR UPDATE NOWAIT`, first.ID); err != nil {
		t.Fatalf("the running job's row is locked by the duplicate enqueue: %v", err)
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

// Stop returns by its deadline even when the database is unreachable, and
// reports the outcomes it could not record.
func TestStopWithDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	pool, direct, proxy := proxied(t, 0)
	ctx := context.Background()
	h, ws := newHolder()
	c, err := core.NewClient(pool, &core.Config{Workers: ws, LeaseDuration: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := core.Enqueue(ctx, direct, heldArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-h.started
	proxy.Cut()
	defer proxy.Restore()
	h.ch(res.ID) <- nil // a success that cannot be written
	stopCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(stopCtx) }()
	select {
	case err = <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("Stop did not return with the database unreachable")
	}
	var se *core.StopError
	if !errors.As(err, &se) || se.Unrecorded != 1 {
		t.Fatalf("Stop returned %v, want a StopError with 1 unrecorded outcome", err)
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

type stormArgs struct{ N int }

func (stormArgs) Kind() string { return "storm" }

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
		WHERE last_error <> 'permanent: storm ' || (args->>'N') AND last_error <> 'retry in 1h0m0s: storm ' || (args->>'N')
		   OR jsonb_array_length(history) <> 1
		   OR state <> CASE WHEN (args->>'N')::int % 2 = 0 THEN 'dead' ELSE 'queued' END
		   OR (state = 'queued' AND run_at < now() + interval '59 minutes')`); bad != 0 {
		t.Fatalf("%d failures recorded wrong", bad)
	}
	if txs := count(t, pool, `SELECT count(DISTINCT xmin::text) FROM relay_jobs`); txs > n/4 {
		t.Fatalf("%d failures took %d transactions: not batched", n, txs)
	}
}

// A graceful Stop returns prefetched jobs to the queue without starting
// them.
func TestStopDoesNotStartPrefetchedJobs(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	h, ws := newHolder()
	c, err := core.NewClient(pool, &core.Config{Workers: ws,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1, Prefetch: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var params []core.EnqueueParams
	for i := range 3 {
		params = append(params, core.EnqueueParams{Args: heldArgs{N: i}})
	}
	if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
		t.Fatal(err)
	}
	first := <-h.started
	waitFor(t, "all three claimed", func() bool { return c.Stats().Claimed == 3 })
	stopped := make(chan error, 1)
	stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	go func() { stopped <- c.Stop(stopCtx) }()
	waitFor(t, "prefetched jobs released", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_jobs WHERE state = 'queued' AND attempt = 0`) == 2
	})
	h.ch(first) <- nil
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Succeeded != 1 || s.Released != 2 {
		t.Fatalf("stats %+v, want 1 success and 2 released", s)
	}
	if len(h.started) != 0 {
		t.Fatal("a prefetched job started during the stop")
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

type timeoutArgs struct{}

func (timeoutArgs) Kind() string { return "timeout" }

type timeoutWorker struct{}

func (timeoutWorker) Work(ctx context.Context, j *core.Job[timeoutArgs]) error {
	<-ctx.Done()
	return ctx.Err()
}

func (timeoutWorker) Timeout(*core.JobRow) time.Duration { return 50 * time.Millisecond }

// A kind's Timeout ending an attempt is recorded as such, not as a bare
// "context deadline exceeded".
func TestKindTimeoutRecordsItsCause(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.Worker[timeoutArgs](timeoutWorker{}))
	startClient(t, pool, &core.Config{Workers: ws})
	res, err := core.Enqueue(ctx, pool, timeoutArgs{}, &core.EnqueueOpts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	j := waitState(t, pool, res.ID, core.StateDead)
	if !strings.Contains(j.LastError, "timed out after 50ms") {
		t.Fatalf("last_error %q does not name the timeout", j.LastError)
	}
}

// A cancel notification names the attempt it cancels: one about an earlier
// attempt of the job leaves the running attempt alone.
func TestStaleCancelNotificationIgnored(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	h, ws := newHolder()
	startClient(t, pool, &core.Config{Workers: ws})
	res, err := core.Enqueue(ctx, pool, heldArgs{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-h.started
	if _, err := pool.Exec(ctx, `SELECT pg_notify('relay_control', 'cancel:' || $1::text || ':' || gen_random_uuid()::text)`, strconv.FormatInt(res.ID, 10)); err != nil {
		t.Fatal(err)
	}
	// Notifications arrive in order: once a later job has started, the
	// stale cancel has been handled.
	if _, err := core.Enqueue(ctx, pool, heldArgs{N: 2}, nil); err != nil {
		t.Fatal(err)
	}
	second := <-h.started
	if _, ok := h.ended(res.ID); ok {
		t.Fatal("a stale cancel notification cancelled the running attempt")
	}
	if err := core.Cancel(ctx, pool, res.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the current cancel to reach the handler", func() bool { _, ok := h.ended(res.ID); return ok })
	if e, _ := h.ended(res.ID); !errors.Is(e.cause, core.ErrJobCancelled) {
		t.Fatalf("cause %v, want ErrJobCancelled", e.cause)
	}
	h.ch(second) <- nil
}

type flakyArgs struct{}

func (flakyArgs) Kind() string { return "flaky" }

// A retry without delay and a job released by a stopping client wake the
// queue's workers: with a poll of an hour, nothing else would.
func TestRetriesAndReleasesWakeTheQueue(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[flakyArgs](func(ctx context.Context, j *core.Job[flakyArgs]) error {
		if j.Attempt == 1 {
			return core.RetryIn(0, errors.New("again at once"))
		}
		return nil
	}))
	startClient(t, pool, &core.Config{Workers: ws, PollInterval: time.Hour})
	res, err := core.Enqueue(ctx, pool, flakyArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if j := waitState(t, pool, res.ID, core.StateSucceeded); j.Attempt != 2 {
		t.Fatalf("attempt %d", j.Attempt)
	}

	// A holds a job and stops; B, started after the claim and polling once
	// an hour, hears of the release.
	pool2 := testdb.New(t)
	h, wsA := newHolder()
	a, err := core.NewClient(pool2, &core.Config{Workers: wsA, // one slot, held: the probe below is B's
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // a no-op once stopped below
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.Stop(ctx)
	})
	held, err := core.Enqueue(ctx, pool2, heldArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-h.started
	wsB := core.NewWorkers()
	core.MustAddWorker(wsB, core.WorkFunc[heldArgs](func(ctx context.Context, j *core.Job[heldArgs]) error { return nil }))
	b := startClient(t, pool2, &core.Config{Workers: wsB, PollInterval: time.Hour})
	// Once B has run a probe job, it waits for a notification (or its poll).
	probe, err := core.Enqueue(ctx, pool2, heldArgs{N: 99}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, pool2, probe.ID, core.StateSucceeded)
	// The last quarter of Stop's time (at most 2s) records the release:
	// the 500ms of a 2s stop may not be enough on a loaded machine.
	stopCtx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	if err := a.Stop(stopCtx); err != nil {
		var se *core.StopError
		if !errors.As(err, &se) || se.Unrecorded != 0 {
			t.Fatalf("stop: %v", err)
		}
	}
	if j := waitState(t, pool2, held.ID, core.StateSucceeded); j.AttemptedBy != b.ID() {
		t.Fatalf("released job run by %s, want B", j.AttemptedBy)
	}
}

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A clean Stop logs no warning: a rescue cut short by the stop is not a
// failure.
func TestCleanStopLogsNoWarning(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	_, ws := newHolder()
	for range 5 {
		c, err := core.NewClient(pool, &core.Config{Workers: ws, Logger: logger, RescueInterval: time.Millisecond,
			Retention: core.Retention{Interval: time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		// The rescuer and the cleaner start at once: a stop now cuts them
		// short more often than not.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	// The one warning allowed is about the server's settings: the shared
	// development server runs with autovacuum off (core/vacuum.go).
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if line != "" && !strings.Contains(line, "autovacuum is off") {
			out = append(out, line)
		}
	}
	if len(out) > 0 {
		t.Fatalf("a clean stop logged:\n%s", strings.Join(out, "\n"))
	}
}
