package workflow_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// Every step's function finds the same idempotency key on each of its
// attempts (a retry suspends the run, so each attempt is another
// execution), for Step, StepTx, Go and a compensation alike; a step of a
// later generation (ContinueAsNew) gets another; the workflow's own
// context has none.
func TestStepIdempotencyKeyIsStableAcrossAttempts(t *testing.T) {
	b := setup(t)
	var mu sync.Mutex
	seen := map[string][]string{}
	note := func(step string, ctx context.Context) {
		mu.Lock()
		defer mu.Unlock()
		seen[step] = append(seen[step], workflow.StepIdempotencyKey(ctx))
	}
	retry := &workflow.StepOpts{MaxAttempts: 3, Retry: core.RetryPolicyFunc(func(int, error) time.Duration { return time.Millisecond })}
	flaky := func(step string) func(ctx context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			note(step, ctx)
			mu.Lock()
			n := len(seen[step])
			mu.Unlock()
			if n < 3 {
				return 0, errors.New("provider flaked")
			}
			return n, nil
		}
	}
	var outside string
	wf := workflow.MustRegister(b.reg, "keys", func(wctx workflow.Context, gen int) (int, error) {
		outside = workflow.StepIdempotencyKey(wctx)
		if gen == 0 {
			if _, err := workflow.Step(wctx, "charge", flaky("charge"), retry); err != nil {
				return 0, err
			}
			if _, err := workflow.StepTx(wctx, "book", func(ctx context.Context, tx pgx.Tx) (int, error) {
				note("book", ctx)
				return 1, nil
			}, nil); err != nil {
				return 0, err
			}
			if _, err := workflow.Go(wctx, "fan", flaky("fan"), retry).Get(wctx); err != nil {
				return 0, err
			}
			return 0, workflow.ContinueAsNew(wctx, 1)
		}
		if _, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) { note("charge-gen1", ctx); return 1, nil }, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "undo", func(ctx context.Context) error { note("undo", ctx); return nil })
		return 0, core.Permanent(errors.New("fail, to compensate"))
	})
	b.start()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "order-7"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Result(ctx, b.pool); !errors.Is(err, workflow.ErrRunCompensated) {
		t.Fatalf("result: %v, want compensated", err)
	}
	want := map[string]string{
		"charge": "order-7/charge", "book": "order-7/book", "fan": "order-7/fan",
		"charge-gen1": "order-7/1/charge", "undo": "order-7/1/compensate:undo",
	}
	mu.Lock()
	defer mu.Unlock()
	for step, key := range want {
		keys := seen[step]
		if len(keys) == 0 {
			t.Errorf("step %s never ran", step)
		}
		for i, k := range keys {
			if k != key {
				t.Errorf("step %s attempt %d: key %q, want %q", step, i+1, k, key)
			}
		}
	}
	if len(seen["charge"]) != 3 || len(seen["fan"]) != 3 {
		t.Errorf("charge ran %d times, fan %d, want 3 each (two retries)", len(seen["charge"]), len(seen["fan"]))
	}
	if outside != "" {
		t.Errorf("the workflow's own context has key %q, want none", outside)
	}
}
