package core_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type echoArgs struct {
	Msg string `json:"msg"`
}

func (echoArgs) Kind() string { return "echo" }

func TestRunsJob(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	got := make(chan string, 1)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		got <- j.Args.Msg
		return nil
	}))
	startClient(t, pool, &core.Config{Workers: ws})
	res, err := core.Enqueue(context.Background(), pool, echoArgs{Msg: "hi"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if msg := <-got; msg != "hi" {
		t.Fatalf("handler got %q", msg)
	}
	j := waitState(t, pool, res.ID, core.StateSucceeded)
	if j.Attempt != 1 || j.FinalizedAt == nil || len(j.History) != 0 {
		t.Fatalf("succeeded job: attempt=%d finalized=%v history=%v", j.Attempt, j.FinalizedAt, j.History)
	}
}

func TestRetriesThenSucceeds(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var calls atomic.Int32
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		if calls.Add(1) <= 2 {
			return core.RetryIn(0, errors.New("flaky"))
		}
		return nil
	}))
	startClient(t, pool, &core.Config{Workers: ws})
	res, err := core.Enqueue(context.Background(), pool, echoArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	j := waitState(t, pool, res.ID, core.StateSucceeded)
	if j.Attempt != 3 || len(j.History) != 2 || j.History[0].Error == "" {
		t.Fatalf("attempt=%d history=%+v", j.Attempt, j.History)
	}
}

// NewClient refuses negative settings (which used to panic a library
// goroutine or fail every statement); nil handles of any kind give one
// clear error; AddWorker refuses a kind Enqueue would refuse.
func TestConfigAndHandleValidation(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(context.Context, *core.Job[echoArgs]) error { return nil }))
	for _, cfg := range []core.Config{
		{PollInterval: -time.Second},
		{HeartbeatInterval: -time.Second},
		{LeaseDuration: -time.Second},
		{FetchLimit: -1},
		{Retention: core.Retention{BatchSize: -1}},
		{Queues: map[string]core.QueueConfig{"q\x00": {}}},
	} {
		cfg.Workers = ws
		if _, err := core.NewClient(pool, &cfg); err == nil {
			t.Errorf("NewClient accepted %+v", cfg)
		}
	}
	var nilPool *pgxpool.Pool
	if _, err := core.NewClient(nilPool, nil); err == nil {
		t.Error("NewClient accepted a nil pool")
	}
	sqldb := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { sqldb.Close() })
	for _, db := range []core.DB{nil, nilPool, (*sql.DB)(nil)} {
		_, err := core.Enqueue(ctx, db, echoArgs{}, nil)
		if !errors.Is(err, core.ErrUnsupportedDB) {
			t.Fatalf("Enqueue on %T: %v", db, err)
		}
		if strings.Count(err.Error(), "unsupported database handle") != 1 {
			t.Fatalf("repeats itself: %q", err)
		}
	}
	if err := core.AddWorker(core.NewWorkers(), core.WorkFunc[kindNul](func(context.Context, *core.Job[kindNul]) error { return nil })); err == nil {
		t.Fatal("AddWorker accepted a kind with a NUL byte")
	}
	if err := core.AddWorker(core.NewWorkers(), core.WorkFunc[kindLong](func(context.Context, *core.Job[kindLong]) error { return nil })); err == nil {
		t.Fatal("AddWorker accepted a 256-byte kind")
	}
}

type kindNul struct{}

func (kindNul) Kind() string { return "k\x00" }

type kindLong struct{}

func (kindLong) Kind() string { return strings.Repeat("k", 256) }
