package core_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type blockArgs struct{}

func (blockArgs) Kind() string { return "block" }

// blocking registers a worker that reports each start and then waits for
// release (ignoring its context unless honourCtx), returning what release
// sends.
func blocking(honourCtx bool) (*core.Workers, chan *core.Job[blockArgs], chan error, chan error) {
	started := make(chan *core.Job[blockArgs], 10)
	release := make(chan error, 10)
	ctxErr := make(chan error, 10)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[blockArgs](func(ctx context.Context, j *core.Job[blockArgs]) error {
		started <- j
		if honourCtx {
			select {
			case err := <-release:
				return err
			case <-ctx.Done():
				ctxErr <- context.Cause(ctx)
				return ctx.Err()
			}
		}
		return <-release
	}))
	return ws, started, release, ctxErr
}

// A late worker — whose lease expired and whose job was rescued and run by
// another worker — cannot overwrite anything; the refused write is counted.
func TestLateWorkerIsFenced(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	wsA, startedA, releaseA, _ := blocking(false)
	// A's lease is long, so its own heartbeat cannot race the test.
	// One slot, busy with the stalled job: A cannot take the job back.
	a := startClient(t, pool, &core.Config{Workers: wsA, ID: "worker-a", LeaseDuration: time.Minute,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	res, _ := core.Enqueue(ctx, pool, blockArgs{}, nil)
	<-startedA

	// A stalls past its lease (simulated: the lease is made to expire).
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, res.ID); err != nil {
		t.Fatal(err)
	}
	wsB := core.NewWorkers()
	core.MustAddWorker(wsB, core.WorkFunc[blockArgs](func(ctx context.Context, j *core.Job[blockArgs]) error { return nil }))
	startClient(t, pool, &core.Config{Workers: wsB, ID: "worker-b", RescueInterval: 20 * time.Millisecond,
		RetryPolicy: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
	j := waitState(t, pool, res.ID, core.StateSucceeded)
	if j.AttemptedBy != "worker-b" || j.Attempt != 2 || len(j.History) != 1 || j.History[0].Error != "lease expired" || j.History[0].Worker != "worker-a" {
		t.Fatalf("after rescue: %+v", j)
	}

	// A wakes up and reports success: refused by the fence.
	releaseA <- nil
	waitFor(t, "A's refused write counted", func() bool { return a.Stats().LeaseLost == 1 })
	j2, _ := core.JobGet(ctx, pool, res.ID)
	if j2.AttemptedBy != "worker-b" || j2.State != core.StateSucceeded || !j2.FinalizedAt.Equal(*j.FinalizedAt) {
		t.Fatalf("late worker changed the job: %+v", j2)
	}
	if a.Stats().Succeeded != 0 {
		t.Fatal("late success counted as a success")
	}
}

// The same fence refuses a late failure.
func TestLateFailureIsFenced(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws, started, release, _ := blocking(false)
	a := startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: time.Minute})
	res, _ := core.Enqueue(ctx, pool, blockArgs{}, nil)
	<-started
	// The job is taken away from A (as a rescue would do).
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'queued', lease_token = NULL, lease_expires_at = NULL, run_at = now() + interval '1 hour' WHERE id = $1`, res.ID); err != nil {
		t.Fatal(err)
	}
	release <- errors.New("late failure")
	waitFor(t, "refused failure counted", func() bool { return a.Stats().LeaseLost == 1 })
	j, _ := core.JobGet(ctx, pool, res.ID)
	if j.State != core.StateQueued || j.LastError != "" || len(j.History) != 0 {
		t.Fatalf("late failure was written: %+v", j)
	}
}

// Heartbeats keep a job that runs far longer than its lease from being
// rescued.
func TestHeartbeatsRenewLease(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws, started, release, _ := blocking(true)
	// The lease is short enough that the job outlives it several times over
	// within the test, and long enough that heartbeats (each bounded by 40%
	// of the lease) are not timed out by a loaded CI machine running the
	// race detector: with 300 ms they were, and 1 s left them 400 ms, two
	// misses in a row cancelling the handler.
	const lease = 2 * time.Second
	startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: lease, RescueInterval: 20 * time.Millisecond})
	res, _ := core.Enqueue(ctx, pool, blockArgs{}, nil)
	<-started
	var first time.Time
	if err := pool.QueryRow(ctx, `SELECT lease_expires_at FROM relay_jobs WHERE id = $1`, res.ID).Scan(&first); err != nil {
		t.Fatal(err)
	}
	// Wait until the lease has been renewed well past several lease lengths.
	waitFor(t, "lease renewed 3 lease lengths over", func() bool {
		var exp time.Time
		pool.QueryRow(ctx, `SELECT lease_expires_at FROM relay_jobs WHERE id = $1`, res.ID).Scan(&exp)
		return exp.Sub(first) > 3*lease
	})
	release <- nil
	j := waitState(t, pool, res.ID, core.StateSucceeded)
	if j.Attempt != 1 || len(j.History) != 0 {
		t.Fatalf("long job was rescued or rerun: %+v", j)
	}
}

// A heartbeat that finds the lease gone cancels the handler's context with
// ErrLeaseLost.
func TestLostLeaseCancelsHandler(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws, started, _, ctxErr := blocking(true)
	c := startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: 300 * time.Millisecond, RescueInterval: -1})
	res, _ := core.Enqueue(ctx, pool, blockArgs{}, nil)
	<-started
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'queued', lease_token = NULL, lease_expires_at = NULL, run_at = now() + interval '1 hour' WHERE id = $1`, res.ID); err != nil {
		t.Fatal(err)
	}
	if cause := <-ctxErr; !errors.Is(cause, core.ErrLeaseLost) {
		t.Fatalf("handler context cause %v, want ErrLeaseLost", cause)
	}
	waitFor(t, "lease loss counted", func() bool { return c.Stats().LeaseLost == 1 })
	if st := jobState(t, pool, res.ID); st != core.StateQueued {
		t.Fatalf("state %s", st)
	}
}

// A job whose worker keeps dying burns its attempts and ends dead rather than
// crash-looping; the rescuer records each lost attempt and gives the job its
// retry delay, as after any failed attempt.
func TestRescuerEndsCrashLoops(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	res, _ := core.Enqueue(ctx, pool, echoArgs{}, &core.EnqueueOpts{MaxAttempts: 2})
	// A "ghost" worker claims the job and dies: its lease is already expired.
	ghostClaim := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'claimed', attempt = attempt + 1, attempted_at = now(),
			attempted_by = 'ghost', lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second'
			WHERE id = $1 AND state = 'queued'`, res.ID); err != nil {
			t.Fatal(err)
		}
	}
	// A maintenance-only client (no workers) runs the rescuer; its retry
	// policy waits an hour after an expired lease.
	var gotAttempt atomic.Int32
	var gotErr atomic.Value
	policy := core.RetryPolicyFunc(func(attempt int, err error) time.Duration {
		gotAttempt.Store(int32(attempt))
		gotErr.Store(err)
		return time.Hour
	})
	startClient(t, pool, &core.Config{RescueInterval: 20 * time.Millisecond, RetryPolicy: policy})
	ghostClaim()
	j := waitState(t, pool, res.ID, core.StateQueued)
	if j.Attempt != 1 || len(j.History) != 1 || !strings.Contains(j.LastError, "ghost stopped renewing") {
		t.Fatalf("after first rescue: %+v", j)
	}
	if wait := time.Until(j.RunAt); wait < 59*time.Minute || wait > 61*time.Minute {
		t.Fatalf("rescued job runs in %s, want the policy's hour", wait)
	}
	if err, _ := gotErr.Load().(error); gotAttempt.Load() != 1 || !errors.Is(err, core.ErrLeaseLost) || !strings.Contains(err.Error(), "ghost") {
		t.Fatalf("policy called with attempt %d, error %v; want 1 and a lost lease naming the worker", gotAttempt.Load(), err)
	}
	ghostClaim()
	j = waitState(t, pool, res.ID, core.StateDead)
	if j.Attempt != 2 || len(j.History) != 2 || j.FinalizedAt == nil {
		t.Fatalf("after second rescue: %+v", j)
	}
}

// Rescuers in many clients at once rescue each expired lease exactly once.
func TestConcurrentRescuers(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	const n = 3000
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'echo' FROM generate_series(1, $1)`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'claimed', attempt = 1, attempted_at = now(), attempted_by = 'ghost',
		lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	var clients []*core.Client
	for i := 0; i < 4; i++ {
		clients = append(clients, startClient(t, pool, &core.Config{RescueInterval: 5 * time.Millisecond}))
	}
	rescued := func() int64 {
		var sum int64
		for _, c := range clients {
			sum += c.Stats().Rescued
		}
		return sum
	}
	// Counters are bumped just after each batch commits.
	waitFor(t, "all rescued", func() bool {
		return count(t, pool, "SELECT count(*) FROM relay_jobs WHERE state = 'queued'") == n && rescued() >= n
	})
	if r := rescued(); r != n {
		t.Fatalf("rescued %d times, want %d", r, n)
	}
	if k := count(t, pool, "SELECT count(*) FROM relay_jobs WHERE jsonb_array_length(history) <> 1"); k != 0 {
		t.Fatalf("%d jobs rescued other than once", k)
	}
}

// stallTracer holds, until open is called or the statement's context ends,
// the first statement containing sql that a client's connection whose
// application_name contains app sends (a connection stalled by a
// partition or a pooler, say), and says when it holds it.
type stallTracer struct {
	app, sql string
	once     sync.Once
	held     chan struct{} // closed when the statement is held
	release  chan struct{}
	opened   sync.Once
}

func newStallTracer(app, sql string) *stallTracer {
	return &stallTracer{app: app, sql: sql, held: make(chan struct{}), release: make(chan struct{})}
}

func (s *stallTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(conn.Config().RuntimeParams["application_name"], s.app) || !strings.Contains(d.SQL, s.sql) {
		return ctx
	}
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.held)
		select {
		case <-s.release:
		case <-ctx.Done():
		}
	}
	return ctx
}

func (s *stallTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *stallTracer) open() { s.opened.Do(func() { close(s.release) }) }

// An attempt whose handler returned keeps its lease while its outcome
// waits to be written: here the completer's write of a success is held
// (its connection stalled) for over three lease lengths. The heartbeats
// renew the lease meanwhile, nothing rescues the job or runs it again,
// and once the write goes through the success is recorded on the first
// attempt.
func TestPendingOutcomeKeepsItsLease(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	stall := newStallTracer("relay-completer", "state = 'succeeded'")
	cfg := pool.Config()
	cfg.ConnConfig.Tracer = stall // the client's own pools copy it
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(traced.Close)
	ws, started, release, _ := blocking(true)
	const lease = 2 * time.Second
	c := startClient(t, traced, &core.Config{Workers: ws, LeaseDuration: lease, RescueInterval: 20 * time.Millisecond})
	t.Cleanup(stall.open) // before the client stops (cleanups run last first)
	res, err := core.Enqueue(ctx, pool, blockArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	var token string
	var first time.Time
	if err := pool.QueryRow(ctx, `SELECT lease_token::text, lease_expires_at FROM relay_jobs WHERE id = $1`, res.ID).Scan(&token, &first); err != nil {
		t.Fatal(err)
	}
	release <- nil
	select {
	case <-stall.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the completer did not write the success")
	}
	waitRenewedWhileHeld(t, pool, res.ID, token, first.Add(3*lease))
	stall.open()
	j := waitState(t, pool, res.ID, core.StateSucceeded)
	if j.Attempt != 1 || len(j.History) != 0 {
		t.Fatalf("the job ran again: attempt %d, history %d entries", j.Attempt, len(j.History))
	}
	select {
	case <-started:
		t.Fatal("the handler ran a second time")
	default:
	}
	// The completer counts the success once its commit returns, after
	// the row is visible as succeeded: wait for the count.
	waitFor(t, "the success counted", func() bool { return c.Stats().Succeeded >= 1 })
	if s := c.Stats(); s.LeaseLost != 0 || s.Succeeded != 1 {
		t.Fatalf("LeaseLost = %d, Succeeded = %d; want 0, 1", s.LeaseLost, s.Succeeded)
	}
}

// waitRenewedWhileHeld waits until the lease of job id's first attempt,
// token, runs past until, and fails at once if the attempt lost it.
func waitRenewedWhileHeld(t *testing.T, pool *pgxpool.Pool, id int64, token string, until time.Time) {
	t.Helper()
	waitFor(t, "the lease renewed past "+until.Format(time.RFC3339Nano)+" while the outcome waits", func() bool {
		var state string
		var attempt int
		var tok *string
		var exp *time.Time
		if err := pool.QueryRow(context.Background(), `SELECT state, attempt, lease_token::text, lease_expires_at FROM relay_jobs WHERE id = $1`, id).
			Scan(&state, &attempt, &tok, &exp); err != nil {
			t.Fatal(err)
		}
		if state != string(core.StateClaimed) || attempt != 1 || tok == nil || *tok != token {
			t.Fatalf("the job was rescued while its outcome waited to be written: state %s, attempt %d", state, attempt)
		}
		return exp.After(until)
	})
}

// The same for a snooze, which its executor writes itself: held (its
// connection stalled) for over three lease lengths, the attempt keeps its
// lease, and once the write goes through the job is queued for later with
// the attempt uncounted and nothing in its history.
func TestPendingSnoozeKeepsItsLease(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	stall := newStallTracer("relay-worker", "greatest(attempt - 1, 0)")
	cfg := pool.Config()
	cfg.ConnConfig.Tracer = stall
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(traced.Close)
	ws, started, release, _ := blocking(true)
	const lease = 2 * time.Second
	c := startClient(t, traced, &core.Config{Workers: ws, LeaseDuration: lease, RescueInterval: 20 * time.Millisecond})
	t.Cleanup(stall.open)
	res, err := core.Enqueue(ctx, pool, blockArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	var token string
	var first time.Time
	if err := pool.QueryRow(ctx, `SELECT lease_token::text, lease_expires_at FROM relay_jobs WHERE id = $1`, res.ID).Scan(&token, &first); err != nil {
		t.Fatal(err)
	}
	release <- core.Snooze(time.Hour)
	select {
	case <-stall.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the executor did not write the snooze")
	}
	waitRenewedWhileHeld(t, pool, res.ID, token, first.Add(3*lease))
	stall.open()
	waitFor(t, "the snooze written", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_jobs WHERE id = $1 AND state = 'queued' AND attempt = 0
			AND run_at > now() + interval '50 minutes' AND history = '[]'::jsonb`, res.ID) == 1
	})
	if s := c.Stats(); s.LeaseLost != 0 {
		t.Fatalf("LeaseLost = %d, want 0", s.LeaseLost)
	}
}
