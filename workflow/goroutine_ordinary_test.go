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

// The foreign-goroutine check raises no false alarm on ordinary Go: a
// primitive called from a helper function or a closure, from a deferred
// function at the function's end, and after a panic the workflow
// recovered itself, all on the run's goroutine, work as written, across
// a replay forced by a sleep.
func TestPrimitivesFromOrdinaryGoCode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fn   func(wctx workflow.Context, ran *atomic.Int32) (int, error)
	}{
		{"helper", func(wctx workflow.Context, ran *atomic.Int32) (int, error) {
			add := func(key string) (int, error) {
				return workflow.Step(wctx, key, func(ctx context.Context) (int, error) { ran.Add(1); return 1, nil }, nil)
			}
			a, err := add("a")
			if err != nil {
				return 0, err
			}
			if err := workflow.Sleep(wctx, "nap", time.Millisecond); err != nil {
				return 0, err
			}
			b, err := add("b")
			return a + b, err
		}},
		{"deferred", func(wctx workflow.Context, ran *atomic.Int32) (out int, err error) {
			defer func() {
				if err == nil {
					var n int
					n, err = workflow.Step(wctx, "last", func(ctx context.Context) (int, error) { ran.Add(1); return 1, nil }, nil)
					out += n
				}
			}()
			a, err := workflow.Step(wctx, "a", func(ctx context.Context) (int, error) { ran.Add(1); return 1, nil }, nil)
			return a, err
		}},
		{"recovered", func(wctx workflow.Context, ran *atomic.Int32) (int, error) {
			func() {
				defer func() { recover() }()
				panic("the workflow's own")
			}()
			if err := workflow.Sleep(wctx, "nap", time.Millisecond); err != nil {
				return 0, err
			}
			a, err := workflow.Step(wctx, "a", func(ctx context.Context) (int, error) { ran.Add(1); return 1, nil }, nil)
			if err != nil {
				return 0, err
			}
			b, err := workflow.Step(wctx, "b", func(ctx context.Context) (int, error) { ran.Add(1); return 1, nil }, nil)
			return a + b, err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			var ran atomic.Int32
			wf := workflow.MustRegister(b.reg, "ordinary", func(wctx workflow.Context, _ int) (int, error) { return tc.fn(wctx, &ran) })
			b.start()
			h, err := workflow.Start(ctx, b.pool, wf, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			out, err := result[int](t, b.pool, h.ID)
			if err != nil || out != 2 {
				t.Fatalf("the run ended %d, %v; want 2", out, err)
			}
			if n := ran.Load(); n != 2 {
				t.Fatalf("the steps ran %d times, want 2", n)
			}
		})
	}
}

// A deferred primitive meets the panic that suspends a run (a sleep): it
// must not run the step early, nor twice. Go's defer runs at the
// function's end, and a user who writes one expects its step once, after
// the sleep.
func TestDeferredStepAcrossASuspension(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var cleanups, before atomic.Int32
	var slept atomic.Bool
	wf := workflow.MustRegister(b.reg, "deferred-cleanup", func(wctx workflow.Context, _ int) (int, error) {
		defer workflow.Step(wctx, "cleanup", func(ctx context.Context) (int, error) {
			if !slept.Load() {
				before.Add(1)
			}
			cleanups.Add(1)
			return 0, nil
		}, nil)
		if err := workflow.Sleep(wctx, "nap", 300*time.Millisecond); err != nil {
			return 0, err
		}
		slept.Store(true)
		return 1, nil
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	out, err := result[int](t, b.pool, h.ID)
	if err != nil || out != 1 {
		t.Fatalf("the run ended %d, %v", out, err)
	}
	if cleanups.Load() != 1 || before.Load() != 0 {
		t.Fatalf("the deferred step ran %d times, %d of them before the sleep ended", cleanups.Load(), before.Load())
	}
}

// A primitive called inside a step's function (a Step within a Step) on
// the run's goroutine is refused with ErrPrimitiveInStep naming both, and
// fails the run: a replay returns the outer step's output without calling
// its function, so the inner step would be in the first execution's
// history only, and the replay after a sleep failed with a false
// non-determinism error.
func TestPrimitiveInsideAStepFunction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "nested", func(wctx workflow.Context, _ int) (int, error) {
		a, err := workflow.Step(wctx, "outer", func(ctx context.Context) (int, error) {
			return workflow.Step(wctx, "inner", func(ctx context.Context) (int, error) { return 1, nil }, nil)
		}, nil)
		if err != nil {
			return 0, err
		}
		if err := workflow.Sleep(wctx, "nap", time.Millisecond); err != nil {
			return 0, err
		}
		c, err := workflow.Step(wctx, "after", func(ctx context.Context) (int, error) { return 1, nil }, nil)
		return a + c, err
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	out, err := result[int](t, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), `Step called inside the function of step "outer"`) {
		t.Fatalf("a Step inside a Step's function ended the run %d, %v; want it failed naming both", out, err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'inner'`, h.ID); n != 0 {
		t.Fatal("the inner step reached history")
	}
}
