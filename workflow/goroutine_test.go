package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/relayq/relay/workflow"
)

// Primitives called from goroutines other than the run's are refused with
// ErrForeignGoroutine naming the primitive, record nothing, and fail the
// run: it never completes on a history missing what its code asked for.
func TestPrimitiveFromAForeignGoroutine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, primitive string
		// call makes the call from a foreign goroutine and reports
		// whether it was refused.
		call func(wctx workflow.Context, i int) bool
	}{
		{"steps", "Step", func(wctx workflow.Context, i int) bool {
			_, err := workflow.Step(wctx, fmt.Sprintf("s%d", i), func(ctx context.Context) (int, error) { return i, nil }, nil)
			return errors.Is(err, workflow.ErrForeignGoroutine)
		}},
		{"sleep", "Sleep", func(wctx workflow.Context, i int) bool {
			return errors.Is(workflow.Sleep(wctx, fmt.Sprintf("nap%d", i), 0), workflow.ErrForeignGoroutine)
		}},
		{"now", "Now", func(wctx workflow.Context, i int) bool {
			return workflow.Now(wctx, fmt.Sprintf("t%d", i)).IsZero() // no error to return: a zero value
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			var refused atomic.Int32
			wf := workflow.MustRegister(b.reg, "fan", func(wctx workflow.Context, n int) (int, error) {
				if _, err := workflow.Step(wctx, "before", func(ctx context.Context) (int, error) { return 0, nil }, nil); err != nil {
					return 0, err
				}
				var wg sync.WaitGroup
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if tc.call(wctx, i) {
							refused.Add(1)
						}
					}()
				}
				wg.Wait()
				return n, nil
			})
			b.start()
			h, err := workflow.Start(ctx, b.pool, wf, 100, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = result[int](t, b.pool, h.ID)
			if !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), tc.primitive+" called") ||
				!strings.Contains(err.Error(), "goroutine other than the run's") {
				t.Fatalf("want the run failed naming %s, got %v", tc.primitive, err)
			}
			if refused.Load() != 100 {
				t.Fatalf("%d of 100 foreign calls refused", refused.Load())
			}
			if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key <> 'before'`, h.ID); n != 0 {
				t.Fatalf("%d foreign calls reached history", n)
			}
		})
	}
}
