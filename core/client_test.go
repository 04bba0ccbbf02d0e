package core_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/testdb"
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
