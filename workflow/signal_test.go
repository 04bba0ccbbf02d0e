package workflow_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayq/relay/workflow"
)

type approval struct {
	By string `json:"by"`
}

// A signal sent before the run waits is kept; one sent while it waits
// wakes it; a signal sent inside a rolled-back transaction never arrives;
// a wait with a timeout ends without one.
func TestSignals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "approve", func(wctx workflow.Context, _ int) ([]string, error) {
		var got []string
		for i := 0; i < 2; i++ {
			a, ok, err := workflow.WaitSignal[approval](wctx, "approve", 0)
			if err != nil || !ok {
				return nil, errors.New("wait failed")
			}
			got = append(got, a.By)
		}
		_, ok, err := workflow.WaitSignal[approval](wctx, "veto", 200*time.Millisecond)
		if err != nil {
			return nil, err
		}
		if ok {
			got = append(got, "vetoed")
		} else {
			got = append(got, "timeout")
		}
		return got, nil
	})
	h, err := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "sig"})
	if err != nil {
		t.Fatal(err)
	}
	// Before any execution: kept in the mailbox.
	if err := workflow.Signal(ctx, b.pool, h.ID, "approve", approval{By: "early"}); err != nil {
		t.Fatal(err)
	}
	// Rolled back: never delivered.
	tx, _ := b.pool.Begin(ctx)
	if err := workflow.Signal(ctx, tx, h.ID, "approve", approval{By: "ghost"}); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	b.start()
	b.waitFor("the run to wait for its second approval", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'signal:approve#2' AND state = 'waiting'`, h.ID) == 1
	})
	if err := workflow.Signal(ctx, b.pool, h.ID, "approve", approval{By: "late"}); err != nil {
		t.Fatal(err)
	}
	out, err := result[[]string](t, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 || out[0] != "early" || out[1] != "late" || out[2] != "timeout" {
		t.Fatalf("got %v", out)
	}
	if err := workflow.Signal(ctx, b.pool, h.ID, "approve", approval{}); !errors.Is(err, workflow.ErrRunFinished) {
		t.Fatalf("signal to a finished run: %v", err)
	}
	if err := workflow.Signal(ctx, b.pool, "nobody", "approve", approval{}); !errors.Is(err, workflow.ErrRunNotFound) {
		t.Fatalf("signal to no run: %v", err)
	}
}

// Many concurrent signals and wake-ups: every signal is consumed by exactly
// one wait, none twice, none lost.
func TestSignalsConsumedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 20
	wf := workflow.MustRegister(b.reg, "collect", func(wctx workflow.Context, _ int) (map[int]int, error) {
		seen := map[int]int{}
		for i := 0; i < n; i++ {
			v, _, err := workflow.WaitSignal[int](wctx, "item", 0)
			if err != nil {
				return nil, err
			}
			seen[v]++
		}
		return seen, nil
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := workflow.Signal(ctx, b.pool, h.ID, "item", i); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	seen, err := result[map[int]int](t, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if seen[i] != 1 {
			t.Fatalf("signal %d received %d times: %v", i, seen[i], seen)
		}
	}
	if c := b.count(`SELECT count(*) FROM relay_workflow_signals WHERE run_id = $1 AND consumed_at IS NULL`, h.ID); c != 0 {
		t.Fatalf("%d signals left unconsumed", c)
	}
}

// Start and Signal join a database/sql transaction as they join pgx's.
func TestDatabaseSQLTransactions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sqldb := stdlib.OpenDBFromPool(b.pool)
	defer sqldb.Close()
	wf := workflow.MustRegister(b.reg, "sql-tx", func(wctx workflow.Context, n int) (int, error) {
		v, _, err := workflow.WaitSignal[int](wctx, "add", 0)
		return n + v, err
	})
	b.start()
	tx, err := sqldb.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := workflow.Start(ctx, tx, wf, 40, &workflow.StartOpts{ID: "via-sql"})
	if err != nil {
		t.Fatal(err)
	}
	if err := workflow.Signal(ctx, tx, h.ID, "add", 2); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if out, err := h.Result(ctx, sqldb); err != nil || out != 42 {
		t.Fatal(out, err)
	}
	if _, err := workflow.Get(ctx, sqldb, h.ID); err != nil {
		t.Fatal(err)
	}
	if runs, err := workflow.List(ctx, sqldb, nil); err != nil || len(runs) != 1 {
		t.Fatal(runs, err)
	}
}
