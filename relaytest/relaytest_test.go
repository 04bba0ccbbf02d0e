package relaytest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/relaytest"
	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type receiptArgs struct {
	OrderID int64 `json:"order_id"`
}

func (receiptArgs) Kind() string { return "receipt.send" }

type otherArgs struct{}

func (otherArgs) Kind() string { return "other" }

// fakeT records failures instead of ending the test, to check that the
// helpers fail when they should.
type fakeT struct {
	testing.TB
	failed string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
}

func TestRequireEnqueuedInTransaction(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := core.Enqueue(ctx, tx, receiptArgs{OrderID: 42}, &core.EnqueueOpts{Queue: "email", Priority: new(0), Tags: []string{"tenant:acme"}}); err != nil {
		t.Fatal(err)
	}
	job := relaytest.RequireEnqueued[receiptArgs](ctx, t, tx, &relaytest.RequireOpts{Queue: "email", Priority: new(0), Tags: []string{"tenant:acme"}, Count: 1})
	if job.Args.OrderID != 42 {
		t.Fatalf("args %+v", job.Args)
	}
	relaytest.RequireNotEnqueued[otherArgs](ctx, t, tx, nil)
	// Outside the transaction nothing is visible yet.
	relaytest.RequireNotEnqueued[receiptArgs](ctx, t, pool, nil)

	for name, check := range map[string]func(tb testing.TB){
		"wrong queue": func(tb testing.TB) {
			relaytest.RequireEnqueued[receiptArgs](ctx, tb, tx, &relaytest.RequireOpts{Queue: "sms"})
		},
		"missing kind": func(tb testing.TB) { relaytest.RequireEnqueued[otherArgs](ctx, tb, tx, nil) },
		"wrong count": func(tb testing.TB) {
			relaytest.RequireEnqueued[receiptArgs](ctx, tb, tx, &relaytest.RequireOpts{Count: 2})
		},
		"missing tag": func(tb testing.TB) {
			relaytest.RequireEnqueued[receiptArgs](ctx, tb, tx, &relaytest.RequireOpts{Tags: []string{"x"}})
		},
		"not expected": func(tb testing.TB) { relaytest.RequireNotEnqueued[receiptArgs](ctx, tb, tx, nil) },
		"wrong state": func(tb testing.TB) {
			relaytest.RequireEnqueued[receiptArgs](ctx, tb, tx, &relaytest.RequireOpts{States: []core.JobState{core.StateDead}})
		},
		"wrong priority": func(tb testing.TB) {
			relaytest.RequireEnqueued[receiptArgs](ctx, tb, tx, &relaytest.RequireOpts{Priority: new(3)})
		},
	} {
		f := &fakeT{TB: t}
		check(f)
		if f.failed == "" {
			t.Errorf("%s: did not fail", name)
		}
	}
}

type receiptWorker struct {
	sent    []int64
	timeout time.Duration
}

func (w *receiptWorker) Work(ctx context.Context, j *core.Job[receiptArgs]) error {
	switch j.Args.OrderID {
	case 0:
		panic("no order")
	case -1:
		<-ctx.Done()
		return context.Cause(ctx)
	}
	w.sent = append(w.sent, j.Args.OrderID)
	return nil
}

func (w *receiptWorker) Timeout(*core.JobRow) time.Duration { return w.timeout }

func TestWorkWithoutClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := &receiptWorker{timeout: 50 * time.Millisecond}
	if err := relaytest.Work(ctx, t, w, receiptArgs{OrderID: 7}, nil); err != nil || len(w.sent) != 1 || w.sent[0] != 7 {
		t.Fatalf("err %v, sent %v", err, w.sent)
	}
	var pe *core.PanicError
	if err := relaytest.Work(ctx, t, w, receiptArgs{}, nil); !errors.As(err, &pe) {
		t.Fatalf("a panic came back as %v", err)
	}
	if err := relaytest.Work(ctx, t, w, receiptArgs{OrderID: -1}, nil); err == nil {
		t.Fatal("the worker's Timeout did not apply")
	}
}

type ledgerArgs struct {
	Amount int `json:"amount"`
}

func (ledgerArgs) Kind() string { return "ledger.post" }

// With DB, the job is real: a worker that completes in its transaction
// works, and a plain success is recorded.
func TestWorkWithDB(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (amount int)`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var id int64
	w := core.WorkFunc[ledgerArgs](func(ctx context.Context, j *core.Job[ledgerArgs]) error {
		id = j.ID
		if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, j.Args.Amount); err != nil {
			return err
		}
		return core.CompleteTx(ctx, tx, j)
	})
	if err := relaytest.Work(ctx, t, w, ledgerArgs{Amount: 5}, &relaytest.WorkOpts{DB: tx, Enqueue: &core.EnqueueOpts{Queue: "finance"}}); err != nil {
		t.Fatal(err)
	}
	j, err := core.JobGet(ctx, tx, id)
	if err != nil || j.State != core.StateSucceeded || j.Attempt != 1 || j.Queue != "finance" {
		t.Fatalf("job after Work: %+v, %v", j, err)
	}
	plain := core.WorkFunc[receiptArgs](func(ctx context.Context, j *core.Job[receiptArgs]) error { id = j.ID; return nil })
	if err := relaytest.Work(ctx, t, plain, receiptArgs{OrderID: 1}, &relaytest.WorkOpts{DB: tx}); err != nil {
		t.Fatal(err)
	}
	relaytest.RequireEnqueued[receiptArgs](ctx, t, tx, &relaytest.RequireOpts{States: []core.JobState{core.StateSucceeded}, Count: 1})
}
