package workflow_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// rescueNow simulates what the rescuer does to a stalled execution: the
// run job's lease moves on (a new token, expired), so the rescuer requeues
// it and the old attempt no longer holds the run.
func (b *bundle) rescueNow(runID string) {
	b.t.Helper()
	if _, err := b.pool.Exec(context.Background(), `
		UPDATE relay_jobs SET lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second'
		WHERE id = (SELECT job_id FROM relay_workflow_runs WHERE id = $1) AND state = 'claimed'`, runID); err != nil {
		b.t.Fatal(err)
	}
}

func createPayments(t *testing.T, b *bundle) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), `CREATE TABLE payments (run_id text, amount int)`); err != nil {
		t.Fatal(err)
	}
}

// An execution that lost the run's lease (rescued while it ran) cannot
// record its step: the checkpoint is refused and counted, and the rescued
// run's next execution does the step again; the StepTx before it, already
// checkpointed with its payment row, is not repeated.
func TestLateCheckpointRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createPayments(t, b)
	var confirms atomic.Int32
	wf := workflow.MustRegister(b.reg, "pay", func(wctx workflow.Context, amount int) (string, error) {
		if _, err := workflow.StepTx(wctx, "charge", func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1, $2)`, wctx.RunID(), amount)
			return amount, err
		}, nil); err != nil {
			return "", err
		}
		return workflow.Step(wctx, "confirm", func(ctx context.Context) (string, error) {
			if confirms.Add(1) == 1 {
				b.rescueNow(wctx.RunID()) // the lease moves on while the step runs
				return "late", nil
			}
			return "on time", nil
		}, nil)
	})
	b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond})
	h, _ := workflow.Start(context.Background(), b.pool, wf, 42, nil)
	out, err := result[string](t, b.pool, h.ID)
	if err != nil || out != "on time" {
		t.Fatalf("output %q, %v", out, err)
	}
	// The stalled execution's refused write races the rescued one, which
	// may finish the run first on a loaded machine: wait for the count.
	b.waitFor("the late checkpoint refused", func() bool { return b.reg.Stats().LateCheckpointsRefused >= 1 })
	if got := b.reg.Stats().LateCheckpointsRefused; got != 1 {
		t.Fatalf("late checkpoints refused %d, want 1", got)
	}
	if n := b.count(`SELECT count(*) FROM payments`); n != 1 {
		t.Fatalf("%d payments, want exactly 1", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'confirm' AND output = '"on time"'`, h.ID); n != 1 {
		t.Fatal("confirm's checkpoint is not the rescued execution's")
	}
}

// A paused executor (SIGSTOP-like: it holds a step while its run is
// rescued and finished by another execution) cannot fork the run when it
// resumes: its checkpoint is refused, the run's outcome and steps stay the
// rescuer's, and it never reaches the steps after.
func TestPausedExecutorCannotFork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createPayments(t, b)
	paused := make(chan struct{})
	resume := make(chan struct{})
	var slowCalls atomic.Int32
	wf := workflow.MustRegister(b.reg, "fork", func(wctx workflow.Context, _ int) (string, error) {
		who, err := workflow.Step(wctx, "slow", func(ctx context.Context) (string, error) {
			if slowCalls.Add(1) == 1 {
				close(paused)
				<-resume // ignores ctx, as a stopped process would
				return "A", nil
			}
			return "B", nil
		}, nil)
		if err != nil {
			return "", err
		}
		if _, err := workflow.StepTx(wctx, "after", func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1, 1)`, who)
			return 0, err
		}, nil); err != nil {
			return "", err
		}
		return who, nil
	})
	b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond})
	h, _ := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	select {
	case <-paused:
	case <-time.After(30 * time.Second):
		t.Fatal("first execution never started")
	}
	b.rescueNow(h.ID)
	out, err := result[string](t, b.pool, h.ID)
	if err != nil || out != "B" {
		t.Fatalf("output %q, %v", out, err)
	}
	close(resume)
	b.waitFor("the paused execution's refused checkpoint", func() bool { return b.reg.Stats().LateCheckpointsRefused == 1 })
	if n := b.count(`SELECT count(*) FROM payments`); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if n := b.count(`SELECT count(*) FROM payments WHERE run_id = 'B'`); n != 1 {
		t.Fatal("the effect is not the rescuing execution's")
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'slow' AND output = '"B"'`, h.ID); n != 1 {
		t.Fatal("slow's checkpoint was overwritten by the paused execution")
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1 AND state = 'completed' AND output = '"B"'`, h.ID); n != 1 {
		t.Fatal("run outcome changed")
	}
}

// Two executions of one run racing for one signal (DBOS TypeScript #1205):
// the rescued execution consumes it; the late one, resumed after, cannot
// consume it again nor record anything; the signal is consumed once.
func TestStaleExecutionCannotTakeASignal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	paused := make(chan struct{})
	resume := make(chan struct{})
	var slowCalls atomic.Int32
	wf := workflow.MustRegister(b.reg, "sig-race", func(wctx workflow.Context, _ int) (string, error) {
		who, err := workflow.Step(wctx, "slow", func(ctx context.Context) (string, error) {
			if slowCalls.Add(1) == 1 {
				close(paused)
				<-resume
				return "A", nil
			}
			return "B", nil
		}, nil)
		if err != nil {
			return "", err
		}
		v, _, err := workflow.WaitSignal[string](wctx, "go", 0)
		return who + ":" + v, err
	})
	b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond})
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	<-paused
	b.rescueNow(h.ID)
	b.waitFor("the rescued execution to wait", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'signal:go#1'`, h.ID) == 1
	})
	if err := workflow.Signal(ctx, b.pool, h.ID, "go", "once"); err != nil {
		t.Fatal(err)
	}
	out, err := result[string](t, b.pool, h.ID)
	if err != nil || out != "B:once" {
		t.Fatalf("output %q, %v", out, err)
	}
	close(resume)
	b.waitFor("the stale execution refused", func() bool { return b.reg.Stats().LateCheckpointsRefused >= 1 })
	if n := b.count(`SELECT count(*) FROM relay_workflow_signals WHERE run_id = $1 AND consumed_at IS NOT NULL`, h.ID); n != 1 {
		t.Fatalf("%d signals consumed, want 1", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1 AND output = '"B:once"'`, h.ID); n != 1 {
		t.Fatal("the run's outcome changed")
	}
}

// A checkpoint's transaction is bounded on the server too: a worker cut off
// between the fence and its COMMIT must not keep the run's job row locked
// (and its rescue waiting) until the server notices the dead connection.
func TestCheckpointTransactionIsBoundedOnTheServer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := workflow.MustRegister(b.reg, "bounded", func(wctx workflow.Context, _ int) (string, error) {
		return workflow.StepTx(wctx, "read", func(ctx context.Context, tx pgx.Tx) (string, error) {
			var v string
			err := tx.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&v)
			return v, err
		}, nil)
	})
	b.start()
	h, err := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := result[string](t, b.pool, h.ID)
	if err != nil || out != "30s" {
		t.Fatalf("idle_in_transaction_session_timeout in a StepTx: %q, %v; want 30s", out, err)
	}
}

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
