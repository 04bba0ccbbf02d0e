package workflow_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/workflow"
)

// A StepTx whose commit is slow, waiting on a lock of the user's own
// table (a deferred unique check against another transaction's row),
// with StepOpts.Timeout: the attempt got to its commit before the
// timeout, so its result stands and the execution waits for the commit
// past the timeout; once the other transaction rolls back, the step
// completes once, its row there once.
func TestStepTxTimeoutWithASlowCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.exec(`CREATE TABLE seats (seat int UNIQUE DEFERRABLE INITIALLY DEFERRED, run_id text)`)
	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `INSERT INTO seats VALUES (1, 'holder')`); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	wf := workflow.MustRegister(b.reg, "slow-commit", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.StepTx(wctx, "book", func(ctx context.Context, tx pgx.Tx) (int, error) {
			calls.Add(1)
			_, err := tx.Exec(ctx, `INSERT INTO seats VALUES (1, $1)`, wctx.RunID())
			return 1, err
		}, &workflow.StepOpts{Timeout: 200 * time.Millisecond})
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	// The commit waits past the step's timeout, as the server's clock
	// says.
	b.waitFor("the step's commit waits for the holder's row past the step's timeout", func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
			AND state = 'active' AND query = 'commit' AND now() - query_start > interval '400 milliseconds'`) > 0
	})
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 1 {
		t.Fatalf("the run ended %d, %v", out, err)
	}
	if n := b.count(`SELECT count(*) FROM seats WHERE run_id = $1`, h.ID); n != 1 {
		t.Fatalf("the seat was booked %d times", n)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the step's function ran %d times, want once", n)
	}
}

// A StepTx whose commit fails on the user's own data (a deferred unique
// check against a row committed meanwhile) fails the step, as an error of
// its function does: the workflow gets a *StepError it can handle, after
// the step's own attempts, and the run's executions are not spent on it.
func TestStepTxCommitFailureIsTheStepsError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.exec(`CREATE TABLE seats (seat int UNIQUE DEFERRABLE INITIALLY DEFERRED, run_id text)`)
	b.exec(`INSERT INTO seats VALUES (1, 'taken')`)
	var calls atomic.Int32
	wf := workflow.MustRegister(b.reg, "commit-fails", func(wctx workflow.Context, _ int) (string, error) {
		_, err := workflow.StepTx(wctx, "book", func(ctx context.Context, tx pgx.Tx) (int, error) {
			calls.Add(1)
			_, err := tx.Exec(ctx, `INSERT INTO seats VALUES (1, $1)`, wctx.RunID())
			return 1, err
		}, &workflow.StepOpts{MaxAttempts: 2})
		var se *workflow.StepError
		if !errors.As(err, &se) {
			return "", err
		}
		return "handled: " + se.Message, nil
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{MaxAttempts: 3})
	out, err := result[string](t, b.pool, h.ID)
	if err != nil || !strings.Contains(out, "duplicate key") {
		t.Fatalf("the run ended %q, %v; want the commit's error handled as the step's", out, err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("the step's function ran %d times, want its 2 attempts", n)
	}
}

// A StepTx whose transaction the server ends after fn returned (here it
// idled past idle_in_transaction_session_timeout, set short by fn itself,
// as the 30-second bound every StepTx has would be by a function that
// waits that long between statements) fails that attempt, retried per
// StepOpts: it is not taken for a crashed execution, which spent the
// run's executions and failed it without the step's retries.
func TestStepTxEndedByTheServerFailsTheAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var calls atomic.Int32
	wf := workflow.MustRegister(b.reg, "idle-tx", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.StepTx(wctx, "idle", func(ctx context.Context, tx pgx.Tx) (int, error) {
			if calls.Add(1) > 1 {
				return 2, nil
			}
			var pid int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM set_config('idle_in_transaction_session_timeout', '100ms', true)`).Scan(&pid); err != nil {
				return 0, err
			}
			// Idle in the transaction until the server ends its session.
			b.waitFor("the server ended the idle transaction's session", func() bool {
				return b.count(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) == 0
			})
			return 1, nil
		}, &workflow.StepOpts{MaxAttempts: 2})
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{MaxAttempts: 1})
	out, err := result[int](t, b.pool, h.ID)
	if err != nil || out != 2 {
		t.Fatalf("the run ended %d, %v; want the step's second attempt's 2", out, err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND attempts = 2 AND attempt_log->0->>'error' LIKE '%idle-in-transaction%'`, h.ID); n != 1 {
		t.Fatal("the first attempt is not logged failed with the server's error")
	}
}
