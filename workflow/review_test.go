package workflow_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/relayq/relay/workflow"
)

// A job that is no longer its run's job (the run was retried, or deleted
// and its id started again, while the old job waited to be rescued) must
// not execute the run: it would be a second execution of the run beside
// the current job's, each under a lease of its own, and could fork it.
func TestStaleJobDoesNotExecuteTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	var calls atomic.Int32
	wf := workflow.MustRegister(b.reg, "stale", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "a", func(ctx context.Context) (int, error) {
			calls.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return 1, nil
		}, nil)
	})
	h, err := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	oldJob := b.count(`SELECT job_id FROM relay_workflow_runs WHERE id = 'r'`)
	// The run failed while its job was left behind (its worker died after
	// recording the outcome, before completing the job); an operator
	// retries it: a new job executes the run.
	if _, err := b.pool.Exec(ctx, `UPDATE relay_workflow_runs SET state = 'failed', finished_at = now(), error = 'x' WHERE id = 'r'`); err != nil {
		t.Fatal(err)
	}
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	b.start()
	b.waitFor("the current job in its step and the stale job ended", func() bool {
		return calls.Load() >= 1 && b.count(`SELECT count(*) FROM relay_jobs WHERE id = $1 AND state = 'succeeded'`, oldJob) == 1
	})
	close(release)
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 1 {
		t.Fatal(out, err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("step ran %d times: two jobs executed the run", n)
	}
}
