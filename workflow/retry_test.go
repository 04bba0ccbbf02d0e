package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// retryCase is a run that handles a step's failure, commits a row with a
// StepTx, and then fails; Retry must not commit the row again.
type retryCase struct {
	b *bundle
	// check fails the run after the StepTx while true.
	check atomic.Bool
	// handled counts the calls of the step whose failure the run handles.
	handled atomic.Int32
}

func newRetryCase(t *testing.T) *retryCase {
	t.Helper()
	c := &retryCase{b: setup(t)}
	if _, err := c.b.pool.Exec(context.Background(), `CREATE TABLE bookings (run_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	c.check.Store(true)
	return c
}

// handledFailure is a step that fails for good, its failure handled by a
// fallback step.
func (c *retryCase) handledFailure(wctx workflow.Context) error {
	_, err := workflow.Step(wctx, "gateway", func(ctx context.Context) (int, error) {
		c.handled.Add(1)
		return 0, core.Permanent(errors.New("gateway down"))
	}, nil)
	if err == nil {
		return errors.New("want the gateway step to fail")
	}
	_, err = workflow.Step(wctx, "fallback", func(ctx context.Context) (int, error) { return 1, nil }, nil)
	return err
}

// book is the StepTx whose row must exist once.
func (c *retryCase) book(wctx workflow.Context) error {
	_, err := workflow.StepTx(wctx, "book", func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, err := tx.Exec(ctx, `INSERT INTO bookings (run_id) VALUES ($1)`, wctx.RunID())
		return 1, err
	}, nil)
	return err
}

// later is the check after the StepTx that fails the run while c.check.
func (c *retryCase) later() error {
	if c.check.Load() {
		return errors.New("a later check failed")
	}
	return nil
}

// run starts wf, waits for it to fail, then fixes the check and retries
// it (retries times, the check fixed before the last), and wants it
// completed with the row booked once and the handled step (if the run has
// one) not run again.
func (c *retryCase) run(t *testing.T, wf *workflow.Workflow[int, int], retries int) {
	t.Helper()
	ctx := context.Background()
	h, err := workflow.Start(ctx, c.b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, c.b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("want the run failed, got %v", err)
	}
	for i := 1; i <= retries; i++ {
		if i == retries {
			c.check.Store(false)
		}
		// Asked twice at once (in one transaction, so before the run can
		// execute): the second is refused, and drops nothing more.
		err := pgx.BeginFunc(ctx, c.b.pool, func(tx pgx.Tx) error {
			if err := workflow.Retry(ctx, tx, h.ID); err != nil {
				return err
			}
			if err := workflow.Retry(ctx, tx, h.ID); !errors.Is(err, workflow.ErrNotRetryable) {
				return fmt.Errorf("the second retry: %v, want ErrNotRetryable", err)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("retry %d: %v", i, err)
		}
		_, err = result[int](t, c.b.pool, h.ID)
		if i < retries && !errors.Is(err, workflow.ErrRunFailed) {
			t.Fatalf("retry %d: want the run failed again, got %v", i, err)
		}
		if i == retries && err != nil {
			t.Fatalf("retry %d: want the run completed, got %v", i, err)
		}
	}
	if n := c.b.count(`SELECT count(*) FROM bookings WHERE run_id = $1`, h.ID); n != 1 {
		t.Fatalf("the StepTx's row exists %d times, want once", n)
	}
	if n := c.handled.Load(); n > 1 {
		t.Fatalf("the handled step ran %d times, want once", n)
	}
}

// Retry resumes from the point that failed the run, not from a failure
// the run handled before: a StepTx committed between the two is not run
// again.
func TestRetryAfterHandledFailureKeepsStepTx(t *testing.T) {
	t.Parallel()
	c := newRetryCase(t)
	wf := workflow.MustRegister(c.b.reg, "handled-then-tx", func(wctx workflow.Context, _ int) (int, error) {
		if err := c.handledFailure(wctx); err != nil {
			return 0, err
		}
		if err := c.book(wctx); err != nil {
			return 0, err
		}
		return 1, c.later()
	})
	c.b.start()
	c.run(t, wf, 1)
}

// Retried twice in a row (the run fails again after the first Retry), the
// StepTx still commits once.
func TestRetryTwiceKeepsStepTx(t *testing.T) {
	t.Parallel()
	c := newRetryCase(t)
	wf := workflow.MustRegister(c.b.reg, "retried-twice", func(wctx workflow.Context, _ int) (int, error) {
		if err := c.handledFailure(wctx); err != nil {
			return 0, err
		}
		if err := c.book(wctx); err != nil {
			return 0, err
		}
		return 1, c.later()
	})
	c.b.start()
	c.run(t, wf, 2)
}

// The handled failure is a child's: its *ChildError, handled, is not where
// Retry resumes.
func TestRetryAfterHandledChildFailureKeepsStepTx(t *testing.T) {
	t.Parallel()
	c := newRetryCase(t)
	var childCalls atomic.Int32
	child := workflow.MustRegister(c.b.reg, "failing-child", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "boom", func(ctx context.Context) (int, error) {
			childCalls.Add(1)
			return 0, core.Permanent(errors.New("child broke"))
		}, nil)
	})
	wf := workflow.MustRegister(c.b.reg, "child-then-tx", func(wctx workflow.Context, _ int) (int, error) {
		_, err := workflow.Child(wctx, "c", child, 0, nil).Get(wctx)
		var ce *workflow.ChildError
		if !errors.As(err, &ce) {
			return 0, errors.New("want the child failed")
		}
		if err := c.book(wctx); err != nil {
			return 0, err
		}
		return 1, c.later()
	})
	c.b.start()
	c.run(t, wf, 1)
	if n := childCalls.Load(); n != 1 {
		t.Fatalf("the child's step ran %d times, want once", n)
	}
}

// A sleep between the handled failure and the StepTx (the run suspends and
// replays) changes nothing.
func TestRetryAfterSleepKeepsStepTx(t *testing.T) {
	t.Parallel()
	c := newRetryCase(t)
	wf := workflow.MustRegister(c.b.reg, "sleep-then-tx", func(wctx workflow.Context, _ int) (int, error) {
		if err := c.handledFailure(wctx); err != nil {
			return 0, err
		}
		if err := workflow.Sleep(wctx, "nap", time.Millisecond); err != nil {
			return 0, err
		}
		if err := c.book(wctx); err != nil {
			return 0, err
		}
		return 1, c.later()
	})
	c.b.start()
	c.run(t, wf, 1)
}

// A run whose executions crash-loop (every execution dies in a step, its
// attempts used up) fails; Retry keeps every completed step, a StepTx
// after a handled failure included, and the crashing step runs again.
func TestRetryAfterCrashLoopKeepsStepTx(t *testing.T) {
	t.Parallel()
	c := newRetryCase(t)
	c.check.Store(false) // the crash fails this run, not the check
	var explode atomic.Bool
	explode.Store(true)
	var crashes atomic.Int32
	wf := workflow.MustRegister(c.b.reg, "crash-after-tx", func(wctx workflow.Context, _ int) (int, error) {
		if err := c.handledFailure(wctx); err != nil {
			return 0, err
		}
		if err := c.book(wctx); err != nil {
			return 0, err
		}
		return workflow.Step(wctx, "explode", func(ctx context.Context) (int, error) {
			if explode.Load() {
				crashes.Add(1)
				c.b.rescueNow(wctx.RunID()) // the execution dies here
				return 0, errors.New("killed")
			}
			return 1, nil
		}, nil)
	})
	c.b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond})
	ctx := context.Background()
	h, err := workflow.Start(ctx, c.b.pool, wf, 0, &workflow.StartOpts{MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, c.b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("want the run failed by its crashes, got %v", err)
	}
	explode.Store(false)
	if err := workflow.Retry(ctx, c.b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, c.b.pool, h.ID); err != nil || out != 1 {
		t.Fatalf("after retry: %v %v", out, err)
	}
	if n := c.b.count(`SELECT count(*) FROM bookings WHERE run_id = $1`, h.ID); n != 1 {
		t.Fatalf("the StepTx's row exists %d times, want once", n)
	}
	if n := c.handled.Load(); n != 1 {
		t.Fatalf("the handled step ran %d times, want once", n)
	}
}

// A run whose executions crash-loop in a compensation (the run failed
// after a handled failure and a StepTx, and was undoing) fails; Retry
// resumes the compensation: the StepTx is not run again, and the run ends
// compensated.
func TestRetryAfterCrashInCompensationKeepsStepTx(t *testing.T) {
	t.Parallel()
	c := newRetryCase(t)
	var crashing atomic.Bool
	crashing.Store(true)
	var undone atomic.Int32
	wf := workflow.MustRegister(c.b.reg, "compensation-crash", func(wctx workflow.Context, _ int) (int, error) {
		if err := c.handledFailure(wctx); err != nil {
			return 0, err
		}
		if err := c.book(wctx); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "unbook", func(ctx context.Context) error {
			if crashing.Load() {
				c.b.rescueNow(wctx.RunID()) // the execution dies here
				return errors.New("killed")
			}
			undone.Add(1)
			return nil
		})
		return 1, c.later()
	})
	c.b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond})
	ctx := context.Background()
	h, err := workflow.Start(ctx, c.b.pool, wf, 0, &workflow.StartOpts{MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, c.b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("want the run failed by its crashes, got %v", err)
	}
	crashing.Store(false)
	if err := workflow.Retry(ctx, c.b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, c.b.pool, h.ID); !errors.Is(err, workflow.ErrRunCompensated) {
		t.Fatalf("after retry: want compensated, got %v", err)
	}
	if n := c.b.count(`SELECT count(*) FROM bookings WHERE run_id = $1`, h.ID); n != 1 {
		t.Fatalf("the StepTx's row exists %d times, want once", n)
	}
	if c.handled.Load() != 1 || undone.Load() != 1 {
		t.Fatalf("the handled step ran %d times, the compensation completed %d times; want 1 and 1", c.handled.Load(), undone.Load())
	}
}

// A run failed by a step's error (the function returned its *StepError)
// resumes from that step: it runs again, the steps before it do not.
func TestRetryResumesFromTheStepThatFailedTheRun(t *testing.T) {
	t.Parallel()
	c := newRetryCase(t)
	var verify atomic.Int32
	wf := workflow.MustRegister(c.b.reg, "failed-by-step", func(wctx workflow.Context, _ int) (int, error) {
		if err := c.handledFailure(wctx); err != nil {
			return 0, err
		}
		if err := c.book(wctx); err != nil {
			return 0, err
		}
		return workflow.Step(wctx, "verify", func(ctx context.Context) (int, error) {
			if verify.Add(1) == 1 {
				return 0, core.Permanent(errors.New("not yet"))
			}
			return 1, nil
		}, nil)
	})
	c.b.start()
	c.check.Store(false)
	c.run(t, wf, 1)
	if n := verify.Load(); n != 2 {
		t.Fatalf("the step that failed the run ran %d times, want twice", n)
	}
}

// A StepTx that completed after the step that failed the run is never
// dropped, nor is anything before it: Retry keeps the failed step, and the
// run replays to the same error (its code unchanged), with the StepTx's
// row still once.
func TestRetryNeverDropsAStepTxAfterTheFailedStep(t *testing.T) {
	t.Parallel()
	c := newRetryCase(t)
	var verify atomic.Int32
	wf := workflow.MustRegister(c.b.reg, "tx-after-failure", func(wctx workflow.Context, _ int) (int, error) {
		_, err := workflow.Step(wctx, "verify", func(ctx context.Context) (int, error) {
			verify.Add(1)
			return 0, core.Permanent(errors.New("not valid"))
		}, nil)
		if err != nil {
			// Book (an audit row, say) and fail with the step's error.
			if err := c.book(wctx); err != nil {
				return 0, err
			}
			return 0, err
		}
		return 1, nil
	})
	c.b.start()
	ctx := context.Background()
	h, err := workflow.Start(ctx, c.b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := result[int](t, c.b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
			t.Fatalf("want the run failed, got %v", err)
		}
		if i == 0 {
			if err := workflow.Retry(ctx, c.b.pool, h.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := c.b.count(`SELECT count(*) FROM bookings WHERE run_id = $1`, h.ID); n != 1 {
		t.Fatalf("the StepTx's row exists %d times, want once", n)
	}
	if n := verify.Load(); n != 1 {
		t.Fatalf("the failed step ran %d times, want once (kept before the StepTx)", n)
	}
}

// A run that failed before the resume point was recorded resumes, after
// the backfill migration, from its last failed step, as Retry used to
// compute it, but never runs a completed StepTx again.
func TestRetryOfARunFailedBeforeTheResumePointExisted(t *testing.T) {
	t.Parallel()
	c := newRetryCase(t)
	var verify atomic.Int32
	wf := workflow.MustRegister(c.b.reg, "legacy-failure", func(wctx workflow.Context, _ int) (int, error) {
		if err := c.book(wctx); err != nil {
			return 0, err
		}
		return workflow.Step(wctx, "verify", func(ctx context.Context) (int, error) {
			if verify.Add(1) == 1 {
				return 0, core.Permanent(errors.New("not yet"))
			}
			return 1, nil
		}, nil)
	})
	c.b.start()
	ctx := context.Background()
	h, _ := workflow.Start(ctx, c.b.pool, wf, 0, nil)
	if _, err := result[int](t, c.b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("want failed, got %v", err)
	}
	// As stored by a version without the column, then migrated.
	if _, err := c.b.pool.Exec(ctx, `UPDATE relay_workflow_runs SET retry_from = NULL WHERE id = $1`, h.ID); err != nil {
		t.Fatal(err)
	}
	backfill, err := os.ReadFile("../migrations/20261202010002_workflow_retry_backfill.tx.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.b.pool.Exec(ctx, string(backfill)); err != nil {
		t.Fatal(err)
	}
	if err := workflow.Retry(ctx, c.b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, c.b.pool, h.ID); err != nil || out != 1 {
		t.Fatalf("after retry: %v %v", out, err)
	}
	if n := c.b.count(`SELECT count(*) FROM bookings WHERE run_id = $1`, h.ID); n != 1 || verify.Load() != 2 {
		t.Fatalf("booked %d times (want 1), verify ran %d times (want 2)", n, verify.Load())
	}
}

// Retrying a run that failed in its compensations resumes the
// compensations: the step that failed the run is not run again, and the
// compensations that ran are not repeated.
func TestRetryAfterFailedCompensation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var report, unreserve, refund atomic.Int32
	wf := workflow.MustRegister(b.reg, "saga-retry", func(wctx workflow.Context, _ int) (int, error) {
		noop := func(ctx context.Context) (int, error) { return 0, nil }
		if _, err := workflow.Step(wctx, "charge", noop, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "refund", func(ctx context.Context) error {
			if refund.Add(1) == 1 {
				return core.Permanent(errors.New("bank down"))
			}
			return nil
		})
		if _, err := workflow.Step(wctx, "reserve", noop, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "unreserve", func(ctx context.Context) error { unreserve.Add(1); return nil })
		return workflow.Step(wctx, "report", func(ctx context.Context) (int, error) {
			report.Add(1)
			return 0, core.Permanent(errors.New("report broken"))
		}, nil)
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "bank down") {
		t.Fatalf("want failed by the refund, got %v", err)
	}
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunCompensated) {
		t.Fatalf("want compensated after retry, got %v", err)
	}
	if report.Load() != 1 || unreserve.Load() != 1 || refund.Load() != 2 {
		t.Fatalf("report %d, unreserve %d, refund %d calls; want 1 1 2", report.Load(), unreserve.Load(), refund.Load())
	}
}

// Retry queues the run's new job as Start placed the first: its priority
// and its bound on crashed executions are kept.
func TestRetryKeepsPriorityAndMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "placed", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "fail", func(ctx context.Context) (int, error) {
			return 0, core.Permanent(errors.New("no"))
		}, nil)
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{Priority: 3, MaxAttempts: 2})
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatal(err)
	}
	first := b.count(`SELECT job_id FROM relay_workflow_runs WHERE id = $1`, h.ID)
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id
		WHERE r.id = $1 AND j.id <> $2 AND j.priority = 3 AND j.max_attempts = 2 + 3`, h.ID, first); n != 1 {
		t.Fatal("the retried run's job lost the run's priority or max attempts")
	}
}

// A cancelled run whose compensation failed ends failed; Retry runs again
// only the compensation that failed, with the cancel still asked for, so
// the run ends cancelled. It used to forget the cancel: the replay went on
// with the function past the point where the cancel stopped it (here into
// its hour-long sleep, and then the steps after it).
func TestRetryCancelledRunResumesItsCompensations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var undos, after atomic.Int32
	wf := workflow.MustRegister(b.reg, "cancel-undo", func(wctx workflow.Context, _ int) (int, error) {
		if _, err := workflow.Step(wctx, "a", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "undo-a", func(ctx context.Context) error {
			if undos.Add(1) == 1 {
				return core.Permanent(errors.New("undo a broken"))
			}
			return nil
		})
		if err := workflow.Sleep(wctx, "nap", time.Hour); err != nil {
			return 0, err
		}
		return workflow.Step(wctx, "after", func(ctx context.Context) (int, error) { after.Add(1); return 2, nil }, nil)
	})
	b.start()
	h, err := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "cancel-undo"})
	if err != nil {
		t.Fatal(err)
	}
	b.suspendedJob(h.ID)
	if err := workflow.Cancel(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "undo a broken") {
		t.Fatalf("want failed by its compensation, got %v", err)
	}
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	// Ended, or suspended again in its sleep (the cancel forgotten).
	b.waitFor("the retried run to end or sleep", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs AS r WHERE r.id = $1 AND (r.finished_at IS NOT NULL
			OR EXISTS (SELECT 1 FROM relay_jobs AS j WHERE j.id = r.job_id AND j.state = 'queued' AND j.run_at > now() + interval '10 minutes'))`, h.ID) == 1
	})
	run, err := workflow.Get(ctx, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if run.State != workflow.StateCancelled {
		t.Fatalf("after retry: want cancelled, got %s (%s)", run.State, run.Error)
	}
	if undos.Load() != 2 || after.Load() != 0 {
		t.Fatalf("undo ran %d times (want 2), the step after the sleep %d (want 0)", undos.Load(), after.Load())
	}
}
