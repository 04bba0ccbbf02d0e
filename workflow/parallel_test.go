package workflow_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// Go runs steps in parallel within one execution: three steps that each
// wait for the other two to start all finish; a failed one is retried, the
// collected ones are not run again.
func TestGoRunsStepsInParallel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var started sync.WaitGroup
	started.Add(3)
	var runs [3]atomic.Int32
	fast := &workflow.StepOpts{Retry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })}
	wf := workflow.MustRegister(b.reg, "fan", func(wctx workflow.Context, _ int) (int, error) {
		var fs []*workflow.StepFuture[int]
		for i := 0; i < 3; i++ {
			fs = append(fs, workflow.Go(wctx, "part-"+itoa(i), func(ctx context.Context) (int, error) {
				if runs[i].Add(1) == 1 {
					started.Done()
					started.Wait() // all three run at once, or this never returns
					if i == 1 {
						return 0, errors.New("flaky")
					}
				}
				return i * 10, nil
			}, fast))
		}
		sum := 0
		for _, f := range fs {
			v, err := f.Get(wctx)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	})
	b.start()
	h, _ := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	out, err := result[int](t, b.pool, h.ID)
	if err != nil || out != 30 {
		t.Fatal(out, err)
	}
	if runs[0].Load() != 1 || runs[1].Load() != 2 {
		t.Fatalf("runs %d %d %d: part-0 once (collected before part-1 failed), part-1 twice", runs[0].Load(), runs[1].Load(), runs[2].Load())
	}
}
