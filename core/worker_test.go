package core_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type failArgs struct {
	Mode string `json:"mode"`
}

func (failArgs) Kind() string { return "fail" }

// failWorker fails as its args say, and carries a per-kind retry delay.
type failWorker struct{}

func (failWorker) Work(ctx context.Context, j *core.Job[failArgs]) error {
	switch j.Args.Mode {
	case "permanent":
		return core.Permanent(errors.New("card declined"))
	case "panic":
		panic("boom in handler")
	default:
		return errors.New("plain failure")
	}
}

func (failWorker) RetryDelay(attempt int, err error) time.Duration { return 42 * time.Second }

func TestFailureOutcomes(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.Worker[failArgs](failWorker{}))
	startClient(t, pool, &core.Config{Workers: ws})

	// A plain failure is retried after the kind's own delay, from the
	// database's clock.
	plain, _ := core.Enqueue(ctx, pool, failArgs{Mode: "plain"}, nil)
	j := waitState(t, pool, plain.ID, core.StateQueued)
	waitFor(t, "failure recorded", func() bool {
		j, _ = core.JobGet(ctx, pool, plain.ID)
		return len(j.History) == 1
	})
	if j.LastError != "plain failure" || j.Attempt != 1 || j.History[0].Worker == "" {
		t.Fatalf("plain failure: %+v", j)
	}
	if d := j.RunAt.Sub(j.History[0].FinishedAt); d != 42*time.Second {
		t.Fatalf("retry delay %s, want 42s", d)
	}

	// Permanent: dead after one attempt with attempts left.
	perm, _ := core.Enqueue(ctx, pool, failArgs{Mode: "permanent"}, nil)
	j = waitState(t, pool, perm.ID, core.StateDead)
	if j.Attempt != 1 || !strings.Contains(j.LastError, "card declined") || j.FinalizedAt == nil {
		t.Fatalf("permanent: %+v", j)
	}

	// A panic is a failure with its stack.
	pan, _ := core.Enqueue(ctx, pool, failArgs{Mode: "panic"}, &core.EnqueueOpts{MaxAttempts: 1})
	j = waitState(t, pool, pan.ID, core.StateDead)
	if !strings.Contains(j.LastError, "boom in handler") || !strings.Contains(j.LastError, "worker_test.go") {
		t.Fatalf("panic error lacks message or stack: %q", j.LastError)
	}

	// Attempts exhausted: dead.
	last, _ := core.Enqueue(ctx, pool, failArgs{Mode: "plain"}, &core.EnqueueOpts{MaxAttempts: 1})
	j = waitState(t, pool, last.ID, core.StateDead)
	if j.Attempt != 1 || len(j.History) != 1 {
		t.Fatalf("exhausted: %+v", j)
	}
}

// The client-wide retry policy applies to kinds without their own.
func TestDefaultRetryPolicy(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		return errors.New("nope")
	}))
	startClient(t, pool, &core.Config{Workers: ws, RetryPolicy: core.Backoff{Base: time.Hour, Jitter: -1}})
	res, _ := core.Enqueue(ctx, pool, echoArgs{}, nil)
	var j *core.JobRow
	waitFor(t, "failure recorded", func() bool {
		j, _ = core.JobGet(ctx, pool, res.ID)
		return len(j.History) == 1
	})
	if d := j.RunAt.Sub(j.History[0].FinishedAt); d != time.Hour {
		t.Fatalf("retry delay %s, want 1h", d)
	}
}

// An unknown kind and a payload that does not decode are failures with clear
// errors; the jobs are retried, then dead — never lost.
func TestUnknownKindAndMalformedArgs(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error { return nil }))
	startClient(t, pool, &core.Config{Workers: ws, RetryPolicy: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})

	unknown, _ := core.Enqueue(ctx, pool, withDefaults{}, &core.EnqueueOpts{Queue: core.DefaultQueue, MaxAttempts: 2})
	var bad int64
	if err := pool.QueryRow(ctx, `INSERT INTO relay_jobs (kind, args, max_attempts) VALUES ('echo', '{"msg": 5}', 2) RETURNING id`).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	j := waitState(t, pool, unknown.ID, core.StateDead)
	if j.Attempt != 2 || !strings.Contains(j.LastError, `no worker registered for job kind "with_defaults"`) {
		t.Fatalf("unknown kind: attempt %d error %q", j.Attempt, j.LastError)
	}
	j = waitState(t, pool, bad, core.StateDead)
	if !strings.Contains(j.LastError, "decode args of echo job") || string(j.EncodedArgs) != `{"msg": 5}` {
		t.Fatalf("malformed args: error %q args %s", j.LastError, j.EncodedArgs)
	}
}

// Runnable jobs run in priority order, then run-at order.
func TestClaimOrder(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	base := time.Now().Add(-time.Hour)
	params := []core.EnqueueParams{
		{Args: echoArgs{Msg: "p2-early"}, Opts: &core.EnqueueOpts{Priority: new(2), RunAt: base}},
		{Args: echoArgs{Msg: "p0-late"}, Opts: &core.EnqueueOpts{Priority: new(0), RunAt: base.Add(2 * time.Minute)}},
		{Args: echoArgs{Msg: "p1"}, Opts: &core.EnqueueOpts{Priority: new(1), RunAt: base}},
		{Args: echoArgs{Msg: "p0-early"}, Opts: &core.EnqueueOpts{Priority: new(0), RunAt: base.Add(time.Minute)}},
		{Args: echoArgs{Msg: "future"}, Opts: &core.EnqueueOpts{Priority: new(0), Delay: time.Hour}},
	}
	if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		mu.Lock()
		order = append(order, j.Args.Msg)
		mu.Unlock()
		return nil
	}))
	startClient(t, pool, &core.Config{Workers: ws, Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	waitFor(t, "four jobs", func() bool {
		return count(t, pool, "SELECT count(*) FROM relay_jobs WHERE state = 'succeeded'") == 4
	})
	mu.Lock()
	defer mu.Unlock()
	want := []string{"p0-early", "p0-late", "p1", "p2-early"}
	if strings.Join(order, ",") != strings.Join(want, ",") {
		t.Fatalf("order %v, want %v", order, want)
	}
	if n := count(t, pool, "SELECT count(*) FROM relay_jobs WHERE state = 'queued'"); n != 1 {
		t.Fatalf("the future job should still wait; %d queued", n)
	}
}

// Many clients claiming from one queue run each job exactly once (no
// crashes here, so no re-executions either), counted both in the handlers and
// in SQL.
func TestConcurrentClientsRunEachJobOnce(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	const jobs = 2000
	params := make([]core.EnqueueParams, jobs)
	for i := range params {
		params[i] = core.EnqueueParams{Args: echoArgs{}}
	}
	if _, err := core.EnqueueMany(ctx, pool, params); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[int64]int{}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		mu.Lock()
		runs[j.ID]++
		mu.Unlock()
		return nil
	}))
	var clients []*core.Client
	for i := 0; i < 4; i++ {
		clients = append(clients, startClient(t, pool, &core.Config{Workers: ws, FetchLimit: 7,
			Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 8}}}))
	}
	waitFor(t, "all jobs succeeded", func() bool {
		return count(t, pool, "SELECT count(*) FROM relay_jobs WHERE state = 'succeeded'") == jobs
	})
	mu.Lock()
	defer mu.Unlock()
	if len(runs) != jobs {
		t.Fatalf("%d distinct jobs ran, want %d", len(runs), jobs)
	}
	for id, n := range runs {
		if n != 1 {
			t.Fatalf("job %d ran %d times", id, n)
		}
	}
	if n := count(t, pool, "SELECT count(*) FROM relay_jobs WHERE attempt <> 1"); n != 0 {
		t.Fatalf("%d jobs have attempt <> 1", n)
	}
	var claimed int64
	for _, c := range clients {
		claimed += c.Stats().Claimed
	}
	if claimed != jobs {
		t.Fatalf("clients claimed %d attempts, want %d", claimed, jobs)
	}
}

func TestNewClientValidates(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ws := core.NewWorkers()
	bad := []*core.Config{
		{Workers: ws, LeaseDuration: time.Millisecond},
		{Workers: ws, LeaseDuration: time.Second, HeartbeatInterval: 2 * time.Second},
		{Workers: ws, Queues: map[string]core.QueueConfig{"": {}}},
		{Workers: ws, Queues: map[string]core.QueueConfig{"q": {MaxWorkers: -1}}},
		{Queues: map[string]core.QueueConfig{"q": {}}},
	}
	for i, cfg := range bad {
		if _, err := core.NewClient(pool, cfg); err == nil {
			t.Errorf("config %d accepted", i)
		}
	}
	if _, err := core.NewClient(nil, nil); err == nil {
		t.Error("nil pool accepted")
	}
	if err := core.AddWorker(ws, core.WorkFunc[echoArgs](nil)); err != nil {
		t.Fatal(err)
	}
	if err := core.AddWorker(ws, core.WorkFunc[echoArgs](nil)); err == nil {
		t.Error("duplicate kind accepted")
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
