package workflow_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/workflow"
)

type addItem struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

// A cart workflow takes updates until it holds three items: each accepted update is
// applied by its handler (a step, and the workflow's own variable) and
// answered; a request its validator refuses, one that does not decode and
// one whose handler fails each fail alone and the run goes on; every wait
// suspends the run, so each later execution replays the earlier updates'
// handlers to rebuild the cart, and the output holds every accepted item
// once. An update no HandleUpdate asks for is not handled when the run
// ends; updates to finished and unknown runs, and in a transaction, are
// refused.
func TestUpdate(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var applied atomic.Int32
	cart := workflow.MustRegister(b.reg, "cart", func(wctx workflow.Context, _ int) ([]string, error) {
		var items []string
		open := true
		for open {
			if _, err := workflow.HandleUpdate(wctx, "add", func(wctx workflow.Context, it addItem) (int, error) {
				if it.SKU == "broken" {
					return 0, errors.New("no such product")
				}
				line, err := workflow.Step(wctx, "line:"+it.SKU, func(context.Context) (string, error) {
					applied.Add(1)
					return strings.Repeat(it.SKU, it.Qty), nil
				}, nil)
				if err != nil {
					return 0, err
				}
				items = append(items, line)
				return len(items), nil
			}, &workflow.UpdateOpts[addItem]{Validate: func(it addItem) error {
				if it.Qty <= 0 {
					return errors.New("qty must be positive")
				}
				return nil
			}}); err != nil {
				return nil, err
			}
			if len(items) == 3 {
				open = false
			}
		}
		return items, nil
	})
	b.start()
	h, err := workflow.Start(ctx, b.pool, cart, 0, &workflow.StartOpts{ID: "cart-1"})
	if err != nil {
		t.Fatal(err)
	}
	// Each update is sent once the run has suspended on its wait, so that
	// the next execution replays the earlier handlers (an update sent
	// while the execution still runs is handled by it, without a replay).
	add := func(req any) (int, error) {
		b.waitFor("the run to suspend on its update wait", func() bool {
			return b.count(`SELECT count(*) FROM relay_workflow_runs r JOIN relay_jobs j ON j.id = r.job_id
				WHERE r.id = $1 AND j.state = 'queued'
				  AND EXISTS (SELECT 1 FROM relay_workflow_steps s WHERE s.run_id = r.id AND s.kind = 'update' AND s.state = 'waiting')`, h.ID) == 1
		})
		return workflow.Update[int](ctx, b.pool, b.reg, h.ID, "add", req)
	}
	if n, err := add(addItem{SKU: "a", Qty: 1}); err != nil || n != 1 {
		t.Fatalf("first add: %d, %v", n, err)
	}
	if _, err := add(addItem{SKU: "z", Qty: 0}); !errors.Is(err, workflow.ErrUpdateRejected) || !strings.Contains(err.Error(), "qty must be positive") {
		t.Fatalf("refused add: %v", err)
	}
	if _, err := add("not an item"); !errors.Is(err, workflow.ErrUpdateRejected) || !strings.Contains(err.Error(), "decode the request") {
		t.Fatalf("malformed add: %v", err)
	}
	if _, err := add(addItem{SKU: "broken", Qty: 1}); !errors.Is(err, workflow.ErrUpdateFailed) || !strings.Contains(err.Error(), "no such product") {
		t.Fatalf("failed add: %v", err)
	}
	var ue *workflow.UpdateError
	if _, err := add(addItem{SKU: "y", Qty: -1}); !errors.As(err, &ue) || !ue.Rejected || ue.RunID != "cart-1" || ue.Name != "add" {
		t.Fatalf("UpdateError: %+v", ue)
	}
	if n, err := add(addItem{SKU: "b", Qty: 2}); err != nil || n != 2 {
		t.Fatalf("second add: %d, %v", n, err)
	}
	lost, err := workflow.SendUpdate(ctx, b.pool, h.ID, "remove", addItem{SKU: "a", Qty: 1})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := workflow.Update[int](ctx, tx, b.reg, h.ID, "add", addItem{SKU: "c", Qty: 1}); !errors.Is(err, workflow.ErrUpdateInTransaction) {
		t.Errorf("update in a transaction: %v", err)
	}
	tx.Rollback(ctx) //nolint:errcheck
	if n, err := add(addItem{SKU: "c", Qty: 3}); err != nil || n != 3 {
		t.Fatalf("third add: %d, %v", n, err)
	}
	items, err := h.Result(ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(items, ",") != "a,bb,ccc" {
		t.Fatalf("cart %q, want a,bb,ccc", items)
	}
	if n := applied.Load(); n != 3 {
		t.Errorf("the items' steps ran %d times, want 3 (replays answer them from history)", n)
	}
	run, err := workflow.Get(ctx, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if run.Executions < 4 {
		t.Errorf("%d executions: the waits did not suspend the run", run.Executions)
	}
	if _, err := workflow.UpdateResult[int](ctx, b.pool, b.reg, lost); !errors.Is(err, workflow.ErrUpdateNotHandled) {
		t.Errorf("update no HandleUpdate asked for: %v", err)
	}
	if _, err := workflow.Update[int](ctx, b.pool, b.reg, h.ID, "add", addItem{SKU: "d", Qty: 1}); !errors.Is(err, workflow.ErrRunFinished) {
		t.Errorf("update of a finished run: %v", err)
	}
	if _, err := workflow.Update[int](ctx, b.pool, b.reg, "nope", "add", addItem{SKU: "d", Qty: 1}); !errors.Is(err, workflow.ErrRunNotFound) {
		t.Errorf("update of an unknown run: %v", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_updates WHERE state = 'completed'`); n != 4 {
		t.Errorf("%d completed updates, want 4 (three adds, one failed add)", n)
	}
}

// A worker stopped while an update's handler runs (after the request was
// accepted, before the answer committed) leaves the request pending; the
// next worker handles the same request again, and the caller gets one
// answer.
func TestUpdateSurvivesAWorkerStop(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	entered := make(chan struct{}, 4)
	var attempts atomic.Int32
	wf := workflow.MustRegister(b.reg, "slow-update", func(wctx workflow.Context, _ int) (string, error) {
		var got string
		_, err := workflow.HandleUpdate(wctx, "set", func(wctx workflow.Context, v string) (string, error) {
			out, err := workflow.Step(wctx, "apply", func(ctx context.Context) (string, error) {
				if attempts.Add(1) == 1 {
					entered <- struct{}{}
					<-ctx.Done() // the worker stops under it
					return "", ctx.Err()
				}
				return "applied " + v, nil
			}, nil)
			got = out
			return out, err
		}, nil)
		return got, err
	})
	first := b.start()
	h, err := workflow.Start(ctx, b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	answer := make(chan error, 1)
	var resp string
	go func() {
		var err error
		resp, err = workflow.Update[string](ctx, b.pool, b.reg, h.ID, "set", "x")
		answer <- err
	}()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the handler never ran")
	}
	stopCtx, cancelStop := context.WithTimeout(ctx, 10*time.Second)
	first.Stop(stopCtx) //nolint:errcheck
	cancelStop()
	if n := b.count(`SELECT count(*) FROM relay_workflow_updates WHERE state = 'pending'`); n != 1 {
		t.Fatalf("%d pending updates after the stop, want the accepted one", n)
	}
	b.start()
	if err := <-answer; err != nil || resp != "applied x" {
		t.Fatalf("update answered %q, %v", resp, err)
	}
	if out, err := h.Result(ctx, b.pool); err != nil || out != "applied x" {
		t.Fatalf("run: %q, %v", out, err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND kind = 'update'`, h.ID); n != 1 {
		t.Errorf("%d update checkpoints, want 1", n)
	}
}
