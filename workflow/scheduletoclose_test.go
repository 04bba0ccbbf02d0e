package workflow_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// StepOpts.ScheduleToClose bounds a step's attempts together: a step
// failing every attempt, with a thousand allowed, stops retrying once its
// next attempt would start past the bound; a step that hangs gets what is
// left of the bound as its attempt's timeout. Both fail with an error
// matching ErrStepTimeout, the first wrapping its last attempt's error, on
// the execution that failed them and on the replay after it.
func TestScheduleToClose(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var tries atomic.Int32
	wf := workflow.MustRegister(b.reg, "s2c", func(wctx workflow.Context, _ int) ([]string, error) {
		var got []string
		_, err := workflow.Step(wctx, "flaky", func(ctx context.Context) (int, error) {
			tries.Add(1)
			return 0, errors.New("provider down")
		}, &workflow.StepOpts{MaxAttempts: 1000, ScheduleToClose: time.Second,
			Retry: core.RetryPolicyFunc(func(int, error) time.Duration { return 150 * time.Millisecond })})
		if !errors.Is(err, workflow.ErrStepTimeout) {
			return nil, errors.New("flaky: want ErrStepTimeout, got " + err.Error())
		}
		got = append(got, err.Error())
		_, err = workflow.Step(wctx, "hang", func(ctx context.Context) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		}, &workflow.StepOpts{ScheduleToClose: 300 * time.Millisecond})
		if !errors.Is(err, workflow.ErrStepTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			return nil, errors.New("hang: want ErrStepTimeout and DeadlineExceeded, got " + err.Error())
		}
		got = append(got, err.Error())
		// The errors are the stored ones: a replay sees them again.
		if err := workflow.Sleep(wctx, "replay", time.Millisecond); err != nil {
			return nil, err
		}
		return got, nil
	})
	h, err := workflow.Start(ctx, b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.start()
	out, err := result[[]string](t, b.pool, h.ID)
	if err != nil || len(out) != 2 {
		t.Fatalf("got %v, %v", out, err)
	}
	if n := tries.Load(); n < 2 || n > 20 {
		t.Fatalf("the flaky step ran %d times: want a few, bounded by ScheduleToClose, not its 1000 attempts", n)
	}
	// Its row keeps its first attempt's start: the bound is counted from
	// there, not from the last retry. Each retry waited its 150 ms, so
	// the row spans at least that per retry. (Not the whole second: on a
	// loaded machine the attempts start later than their delays, and the
	// last may begin well before the bound.)
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'flaky' AND state = 'failed'
		AND finished_at - started_at >= $2 * interval '150 milliseconds'`, h.ID, tries.Load()-1); n != 1 {
		t.Fatalf("the flaky step's row does not span its %d attempts from the first one's start", tries.Load())
	}
	bad := workflow.MustRegister(b.reg, "s2c-bad", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "x", func(ctx context.Context) (int, error) { return 1, nil }, &workflow.StepOpts{ScheduleToClose: -time.Second})
	})
	hb, err := workflow.Start(ctx, b.pool, bad, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, hb.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("a negative ScheduleToClose: %v", err)
	}
}
