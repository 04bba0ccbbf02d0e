package core_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/eager"
	"github.com/relayq/relay/internal/jobinsert"
	"github.com/relayq/relay/testkit/testdb"
)

type callerKey struct{}

// eagerLease reads a job's lease as stored.
func eagerLease(t *testing.T, pool *pgxpool.Pool, id int64) (state, by, token string, attempt int) {
	t.Helper()
	err := pool.QueryRow(context.Background(),
		`SELECT state, coalesce(attempted_by, ''), coalesce(lease_token::text, ''), attempt FROM relay_jobs WHERE id = $1`, id).
		Scan(&state, &by, &token, &attempt)
	if err != nil {
		t.Fatal(err)
	}
	return
}

// A job inserted claimed for the client (Lend, then the insert, then
// Adopt: insertClaimed) is stored claimed by it (attempt 1, its id, a lease
// token), and Execute runs it in the caller's goroutine through the middleware, its
// success recorded by the client as a claimed job's.
func TestEagerExecuteRunsInCaller(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ws := core.NewWorkers()
	eg := catchEager(ws)
	var sawValue, sawMiddleware bool
	ws.Use(func(ctx context.Context, job *core.JobRow, next func(context.Context) error) error {
		sawMiddleware = true
		return next(ctx)
	})
	started := make(chan string, 1)
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		sawValue = ctx.Value(callerKey{}) == "the caller"
		started <- j.Args.Msg
		return nil
	}))
	c := startClient(t, pool, &core.Config{Workers: ws, ID: "eager-client", RescueInterval: -1})
	ctx := context.WithValue(context.Background(), callerKey{}, "the caller")
	cl, err := insertClaimed(ctx, pool, eg.of(c), echoArgs{Msg: "hi"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cl.Row == nil || cl.Row.ID != cl.ID {
		t.Fatalf("claimed %+v", cl)
	}
	state, by, token, attempt := eagerLease(t, pool, cl.ID)
	if state != "claimed" || by != "eager-client" || token != cl.Row.LeaseToken.String() || attempt != 1 || cl.Row.Attempt != 1 {
		t.Fatalf("stored: %s by %q token %s attempt %d; row %+v", state, by, token, attempt, cl.Row)
	}
	if err := cl.Execute(ctx); err != nil {
		t.Fatal(err)
	}
	// Execute returned: the handler ran before, in this goroutine's call.
	select {
	case msg := <-started:
		if msg != "hi" || !sawValue || !sawMiddleware {
			t.Fatalf("handler got %q, caller's value %v, middleware %v", msg, sawValue, sawMiddleware)
		}
	default:
		t.Fatal("Execute returned before the handler ran")
	}
	j := waitState(t, pool, cl.ID, core.StateSucceeded)
	if j.Attempt != 1 || j.AttemptedBy != "eager-client" {
		t.Fatalf("after: %+v", j)
	}
	// Execute does not wait for the outcome's write, and a success is
	// counted just after it commits: the row can say succeeded first.
	waitFor(t, "the success counted", func() bool { return c.Stats().Succeeded >= 1 })
	if s := c.Stats(); s.Claimed != 1 || s.Succeeded != 1 {
		t.Fatalf("stats %+v", s)
	}
	if err := cl.Execute(ctx); !errors.Is(err, eager.ErrNotClaimed) {
		t.Fatalf("second Execute: %v, want ErrNotClaimed", err)
	}
}

// An eager job's failure is recorded as any attempt's: retried after its
// delay, its error kept.
func TestEagerFailureIsRetried(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ws := core.NewWorkers()
	eg := catchEager(ws)
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		if j.Attempt == 1 {
			return errors.New("first try fails")
		}
		return nil
	}))
	c := startClient(t, pool, &core.Config{Workers: ws, RetryPolicy: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
	ctx := context.Background()
	cl, err := insertClaimed(ctx, pool, eg.of(c), echoArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Execute(ctx); err == nil || err.Error() != "first try fails" {
		t.Fatalf("Execute: %v", err)
	}
	j := waitState(t, pool, cl.ID, core.StateSucceeded)
	if j.Attempt != 2 || len(j.History) != 1 || j.History[0].Error != "first try fails" {
		t.Fatalf("after retry: %+v", j)
	}
}

// The client's heartbeats renew an eager job's lease while it runs far
// longer than the lease.
func TestEagerLeaseRenewedByHeartbeats(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws, started, release, _ := blocking(true)
	eg := catchEager(ws)
	// 2s: heartbeats are bounded by 40% of the lease, and with 1s two of
	// them slower than 400ms in a row on a loaded machine would cancel the
	// handler.
	const lease = 2 * time.Second
	c := startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: lease, RescueInterval: 20 * time.Millisecond})
	cl, err := insertClaimed(ctx, pool, eg.of(c), blockArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cl.Execute(ctx) }()
	<-started
	var first time.Time
	if err := pool.QueryRow(ctx, `SELECT lease_expires_at FROM relay_jobs WHERE id = $1`, cl.ID).Scan(&first); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "lease renewed 3 lease lengths over", func() bool {
		var exp time.Time
		pool.QueryRow(ctx, `SELECT lease_expires_at FROM relay_jobs WHERE id = $1`, cl.ID).Scan(&exp)
		return exp.Sub(first) > 3*lease
	})
	release <- nil
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	j := waitState(t, pool, cl.ID, core.StateSucceeded)
	if j.Attempt != 1 || len(j.History) != 0 {
		t.Fatalf("long eager job was rescued or rerun: %+v", j)
	}
}

// A process that dies while executing an eager job (simulated: its lease
// expires while it is stalled) loses the job to the rescuer; another
// client runs it again, and the stalled executor's late result is refused
// by the fence.
func TestEagerKilledIsRescued(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	wsA, startedA, releaseA, _ := blocking(false)
	eg := catchEager(wsA)
	// One slot, the eager job's: A cannot claim the job back.
	a := startClient(t, pool, &core.Config{Workers: wsA, ID: "eager-a", LeaseDuration: time.Minute, RescueInterval: -1,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	cl, err := c0(insertClaimed(ctx, pool, eg.of(a), blockArgs{}, nil))
	if err != nil {
		t.Fatal(err)
	}
	doneA := make(chan error, 1)
	go func() { doneA <- cl.Execute(ctx) }()
	<-startedA
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, cl.ID); err != nil {
		t.Fatal(err)
	}
	wsB := core.NewWorkers()
	core.MustAddWorker(wsB, core.WorkFunc[blockArgs](func(ctx context.Context, j *core.Job[blockArgs]) error { return nil }))
	startClient(t, pool, &core.Config{Workers: wsB, ID: "eager-b", RescueInterval: 20 * time.Millisecond,
		RetryPolicy: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
	j := waitState(t, pool, cl.ID, core.StateSucceeded)
	if j.AttemptedBy != "eager-b" || j.Attempt != 2 || len(j.History) != 1 || j.History[0].Worker != "eager-a" {
		t.Fatalf("after rescue: %+v", j)
	}
	releaseA <- nil
	<-doneA
	waitFor(t, "A's refused write counted", func() bool { return a.Stats().LeaseLost == 1 })
	if j2, _ := core.JobGet(ctx, pool, cl.ID); j2.AttemptedBy != "eager-b" || a.Stats().Succeeded != 0 {
		t.Fatalf("late eager executor changed the job: %+v", j2)
	}
}

func c0(cl eager.Job[*core.JobRow], err error) (eager.Job[*core.JobRow], error) {
	if err == nil && cl.Row == nil {
		err = errors.New("job not claimed")
	}
	return cl, err
}

// Stop waits for a running eager job, and at its deadline interrupts it
// (cause ErrShutdown) and returns it to the queue uncounted; a stopped
// client takes no eager job.
func TestEagerStop(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws, started, _, ctxErr := blocking(true)
	eg := catchEager(ws)
	c, err := core.NewClient(pool, &core.Config{Workers: ws})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := insertClaimed(ctx, pool, eg.of(c), blockArgs{}, nil); !errors.Is(err, eager.ErrUnavailable) {
		t.Fatalf("before Start: %v, want eager.ErrUnavailable", err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// A graceful stop waits for the job.
	cl, err := c0(insertClaimed(ctx, pool, eg.of(c), blockArgs{}, nil))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cl.Execute(ctx) }()
	<-started
	stopped := make(chan error, 1)
	// The handler runs until cancelled; Stop keeps the last quarter of its
	// time (at most 2s) to record the release, and the 500ms of a 2s stop
	// can be missed on a loaded machine, leaving the job claimed.
	stopCtx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	go func() { stopped <- c.Stop(stopCtx) }()
	if cause := <-ctxErr; !errors.Is(cause, core.ErrShutdown) {
		t.Fatalf("handler cancelled with %v, want ErrShutdown", cause)
	}
	var se *core.StopError
	if err := <-stopped; !errors.As(err, &se) || se.Interrupted != 1 {
		t.Fatalf("Stop: %v", err)
	}
	<-done
	j := waitState(t, pool, cl.ID, core.StateQueued)
	if j.Attempt != 0 || len(j.History) != 1 || !strings.Contains(j.History[0].Error, "attempt not counted") {
		t.Fatalf("interrupted eager job: %+v", j)
	}
	if _, err := insertClaimed(ctx, pool, eg.of(c), blockArgs{}, nil); !errors.Is(err, eager.ErrUnavailable) {
		t.Fatalf("after Stop: %v, want eager.ErrUnavailable", err)
	}
}

// A graceful Stop does not return while an eager job runs.
func TestEagerStopWaits(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws, started, release, _ := blocking(true)
	eg := catchEager(ws)
	c, err := core.NewClient(pool, &core.Config{Workers: ws})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cl, err := c0(insertClaimed(ctx, pool, eg.of(c), blockArgs{}, nil))
	if err != nil {
		t.Fatal(err)
	}
	go cl.Execute(ctx) //nolint:errcheck
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while the eager job ran", err)
	case <-time.After(200 * time.Millisecond):
	}
	release <- nil
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if st := jobState(t, pool, cl.ID); st != core.StateSucceeded {
		t.Fatalf("state %s", st)
	}
}

// A queue or kind the client does not work is refused with nothing
// written; a full queue is unavailable; a paused queue or a limit leaves
// the job queued for the normal claims instead of bypassing them.
func TestEagerRefusals(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws, started, release, _ := blocking(true)
	eg := catchEager(ws)
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(context.Context, *core.Job[echoArgs]) error { return nil }))
	c := startClient(t, pool, &core.Config{Workers: ws, Queues: map[string]core.QueueConfig{"q": {MaxWorkers: 1}}})
	if _, err := insertClaimed(ctx, pool, eg.of(c), blockArgs{}, &core.EnqueueOpts{Queue: "other"}); !errors.Is(err, eager.ErrNotWorked) {
		t.Fatalf("queue not served: %v", err)
	}
	if _, err := insertClaimed(ctx, pool, eg.of(c), unknownArgs{}, &core.EnqueueOpts{Queue: "q"}); !errors.Is(err, eager.ErrNotWorked) {
		t.Fatalf("kind not registered: %v", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs`); n != 0 {
		t.Fatalf("%d jobs written by refused calls", n)
	}
	// The one slot busy: unavailable.
	cl, err := c0(insertClaimed(ctx, pool, eg.of(c), blockArgs{}, &core.EnqueueOpts{Queue: "q"}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cl.Execute(ctx) }()
	<-started
	if _, err := insertClaimed(ctx, pool, eg.of(c), echoArgs{}, &core.EnqueueOpts{Queue: "q"}); !errors.Is(err, eager.ErrUnavailable) {
		t.Fatalf("no free slot: %v", err)
	}
	release <- nil
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Paused: inserted queued, run once the queue resumes.
	if _, err := core.PauseQueue(ctx, pool, "q", "test"); err != nil {
		t.Fatal(err)
	}
	paused, err := insertClaimed(ctx, pool, eg.of(c), echoArgs{}, &core.EnqueueOpts{Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if paused.Row != nil || jobState(t, pool, paused.ID) != core.StateQueued {
		t.Fatalf("eager job claimed on a paused queue: %+v", paused)
	}
	if err := paused.Execute(ctx); !errors.Is(err, eager.ErrNotClaimed) {
		t.Fatalf("Execute of a queued job: %v", err)
	}
	if _, err := core.ResumeQueue(ctx, pool, "q"); err != nil {
		t.Fatal(err)
	}
	waitState(t, pool, paused.ID, core.StateSucceeded)

	// A limit on the kind: inserted queued, claimed under the limit.
	if err := core.SetLimit(ctx, pool, core.Limit{Kind: "echo", MaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	limited, err := insertClaimed(ctx, pool, eg.of(c), echoArgs{}, &core.EnqueueOpts{Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if limited.Row != nil {
		t.Fatalf("eager job claimed past a limit: %+v", limited.Row)
	}
	waitState(t, pool, limited.ID, core.StateSucceeded)
	// Without the limit the slot (given back by the jobs left queued)
	// takes an eager job again.
	if err := core.DeleteLimit(ctx, pool, core.Limit{Kind: "echo"}); err != nil {
		t.Fatal(err)
	}
	cl, err = c0(insertClaimed(ctx, pool, eg.of(c), echoArgs{}, &core.EnqueueOpts{Queue: "q"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Execute(ctx); err != nil {
		t.Fatal(err)
	}
}

type unknownArgs struct{}

func (unknownArgs) Kind() string { return "nobody-works-this" }

// When the caller's context ends during Execute, the handler is cancelled
// with ErrCallerGone and the attempt goes back to the queue uncounted; the
// client's workers then finish the job.
func TestEagerCallerGone(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ws := core.NewWorkers()
	eg := catchEager(ws)
	calls := make(chan error, 4)
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		if j.Args.Msg == "wait" && ctx.Value(callerKey{}) != nil {
			<-ctx.Done()
			calls <- context.Cause(ctx)
			return ctx.Err()
		}
		calls <- nil
		return nil
	}))
	c := startClient(t, pool, &core.Config{Workers: ws})
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), callerKey{}, "eager"))
	cl, err := c0(insertClaimed(ctx, pool, eg.of(c), echoArgs{Msg: "wait"}, nil))
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := cl.Execute(ctx); err == nil {
		t.Fatal("Execute returned nil after its caller went away")
	}
	if cause := <-calls; !errors.Is(cause, core.ErrCallerGone) {
		t.Fatalf("handler cancelled with %v, want ErrCallerGone", cause)
	}
	// Released, then claimed by the client's own fetch loop (whose
	// context carries no caller value): it succeeds, the interrupted
	// attempt uncounted.
	if cause := <-calls; cause != nil {
		t.Fatal(cause)
	}
	j := waitState(t, pool, cl.ID, core.StateSucceeded)
	if j.Attempt != 1 || len(j.History) != 1 || !strings.Contains(j.History[0].Error, "attempt not counted") {
		t.Fatalf("after the caller left: %+v", j)
	}
}

// inserter is a client's eager inserter, as the workflow layer gets it.
type inserter = eager.Inserter[core.JobArgs, *core.EnqueueOpts, *core.JobRow]

type catchArgs struct{}

func (catchArgs) Kind() string { return "eager.catch" }

// eagerCatcher is a worker asking for the eager inserter of every client
// made with its Workers (eager.Attacher), as the workflow layer's does.
type eagerCatcher struct {
	mu sync.Mutex
	by map[any]inserter
}

func (*eagerCatcher) Work(context.Context, *core.Job[catchArgs]) error { return nil }

func (e *eagerCatcher) AttachEager(c any, ins inserter) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.by[c] = ins
}

// of is c's inserter; c must have been made with the catcher's Workers.
func (e *eagerCatcher) of(c *core.Client) inserter {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.by[c]
}

// catchEager registers an eagerCatcher in ws.
func catchEager(ws *core.Workers) *eagerCatcher {
	e := &eagerCatcher{by: map[any]inserter{}}
	core.MustAddWorker[catchArgs](ws, e)
	return e
}

// Lend with no lending job reserves a worker slot of the queue's own, as
// Insert takes one: refused for a queue or kind the client does not work,
// unavailable while the queue's slots are taken, given back by Release,
// and held by an adopted job until its Execute returns.
func TestEagerLendOwnSlot(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := core.NewWorkers()
	eg := catchEager(ws)
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(context.Context, *core.Job[echoArgs]) error { return nil }))
	c := startClient(t, pool, &core.Config{Workers: ws, Queues: map[string]core.QueueConfig{"q": {MaxWorkers: 1}}})
	ins := eg.of(c)
	if _, err := ins.Lend(ctx, "echo", "other", nil); !errors.Is(err, eager.ErrNotWorked) {
		t.Fatalf("queue not served: %v", err)
	}
	if _, err := ins.Lend(ctx, "nobody-works-this", "q", nil); !errors.Is(err, eager.ErrNotWorked) {
		t.Fatalf("kind not registered: %v", err)
	}
	first, err := ins.Lend(ctx, "echo", "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ins.Lend(ctx, "echo", "q", nil); !errors.Is(err, eager.ErrUnavailable) {
		t.Fatalf("the one slot reserved: %v", err)
	}
	first.Release()
	l, err := ins.Lend(ctx, "echo", "q", nil)
	if err != nil {
		t.Fatalf("after Release: %v", err)
	}
	var id int64
	var at time.Time
	if err := pool.QueryRow(ctx, `
		INSERT INTO relay_jobs (kind, queue, state, attempt, attempted_at, attempted_by, lease_token, lease_expires_at)
		VALUES ('echo', 'q', 'claimed', 1, now(), $1, $2::uuid, now() + $3 * interval '1 millisecond')
		RETURNING id, attempted_at`, l.By, l.Token.String(), l.LeaseMS).Scan(&id, &at); err != nil {
		t.Fatal(err)
	}
	job := l.Adopt(ctx, id, jobinsert.Row{Kind: "echo", Queue: "q", Args: []byte(`{}`), MaxAttempts: 25}, at)
	if _, err := ins.Lend(ctx, "echo", "q", nil); !errors.Is(err, eager.ErrUnavailable) {
		t.Fatalf("the slot held by the adopted job: %v", err)
	}
	if err := job.Execute(ctx); err != nil {
		t.Fatal(err)
	}
	waitState(t, pool, id, core.StateSucceeded)
	again, err := ins.Lend(ctx, "echo", "q", nil)
	if err != nil {
		t.Fatalf("after the adopted job's Execute: %v", err)
	}
	again.Release()
}

// insertClaimed inserts a job of args already claimed for the client of
// ins, as the workflow layer's eager start does: a worker slot reserved
// (Lend with no lending job), the job written claimed in one statement
// (jobinsert.SQLIntoClaimed), then adopted. The job's Row is nil, and its
// Execute ErrNotClaimed, when the statement left it queued (a paused queue,
// a global limit).
func insertClaimed(ctx context.Context, pool *pgxpool.Pool, ins inserter, args core.JobArgs, opts *core.EnqueueOpts) (eager.Job[*core.JobRow], error) {
	queue := core.DefaultQueue
	if opts != nil && opts.Queue != "" {
		queue = opts.Queue
	}
	l, err := ins.Lend(ctx, args.Kind(), queue, nil)
	if err != nil {
		return eager.Job[*core.JobRow]{}, err
	}
	enc, err := json.Marshal(args)
	if err != nil {
		l.Release()
		return eager.Job[*core.JobRow]{}, err
	}
	row := jobinsert.Row{Kind: args.Kind(), Queue: queue, Args: enc, MaxAttempts: core.DefaultMaxAttempts, Metadata: []byte(`{}`)}
	var id int64
	var at *time.Time
	err = pool.QueryRow(ctx, `
WITH ids AS (SELECT nextval(pg_get_serial_sequence('relay_jobs', 'id')) AS id), job AS (`+
		jobinsert.SQLIntoClaimed("ids", "id", 1, jobinsert.NotifyAtCommit, jobinsert.Claim{By: 2, Token: 3, LeaseMS: 4})+`
)
SELECT id, attempted_at FROM job`, string(jobinsert.AppendBatch(nil, []jobinsert.Row{row})), l.By, l.Token.String(), l.LeaseMS).Scan(&id, &at)
	if err != nil {
		l.Release()
		return eager.Job[*core.JobRow]{}, err
	}
	if at == nil {
		l.Release()
		return eager.Job[*core.JobRow]{ID: id, Execute: func(context.Context) error { return eager.ErrNotClaimed }}, nil
	}
	return l.Adopt(ctx, id, row, *at), nil
}
