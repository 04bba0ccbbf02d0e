package workflow_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// Children run in parallel on another queue; the parent suspends in Get
// and is woken by their completion; a failed child is a ChildError.
func TestChildrenFanOutOnAnotherQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	email := workflow.MustRegister(b.reg, "email", func(wctx workflow.Context, to string) (string, error) {
		return workflow.Step(wctx, "send", func(ctx context.Context) (string, error) { return "sent to " + to, nil }, nil)
	})
	broken := workflow.MustRegister(b.reg, "broken", func(wctx workflow.Context, _ string) (string, error) {
		return "", errors.New("report generator down")
	})
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, _ int) ([]string, error) {
		a := workflow.Child(wctx, "a", email, "ann", &workflow.ChildOpts{Queue: "email"})
		c := workflow.Child(wctx, "c", email, "cid", &workflow.ChildOpts{Queue: "email"})
		r := workflow.Child(wctx, "r", broken, "", nil)
		ra, err := a.Get(wctx)
		if err != nil {
			return nil, err
		}
		rc, err := c.Get(wctx)
		if err != nil {
			return nil, err
		}
		_, err = r.Get(wctx)
		var ce *workflow.ChildError
		if !errors.As(err, &ce) || ce.State != workflow.StateFailed || !strings.Contains(ce.Message, "generator down") {
			return nil, errors.New("want ChildError, got " + errString(err))
		}
		return []string{ra, rc}, nil
	})
	b.start(core.DefaultQueue, "email")
	h, _ := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "p"})
	out, err := result[[]string](t, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0] != "sent to ann" || out[1] != "sent to cid" {
		t.Fatalf("out %v", out)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE parent_id = 'p'`); n != 3 {
		t.Fatalf("%d children", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id WHERE r.id IN ('p/a', 'p/c') AND j.queue = 'email'`); n != 2 {
		t.Fatal("children did not run on the email queue")
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// The saga: a failure after two completed steps runs their compensations
// newest first, each once, and the run ends compensated.
func TestCompensation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createPayments(t, b)
	ctx := context.Background()
	var mu sync.Mutex
	var order []string
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	var failures atomic.Int32
	wf := workflow.MustRegister(b.reg, "saga", func(wctx workflow.Context, amount int) (string, error) {
		if _, err := workflow.StepTx(wctx, "charge", func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1, $2)`, wctx.RunID(), amount)
			return 0, err
		}, nil); err != nil {
			return "", err
		}
		workflow.Compensate(wctx, "refund", func(ctx context.Context) error {
			note("refund")
			_, err := b.pool.Exec(ctx, `INSERT INTO payments VALUES ($1, $2)`, wctx.RunID(), -amount)
			return err
		})
		if _, err := workflow.Step(wctx, "reserve", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		workflow.Compensate(wctx, "release", func(ctx context.Context) error {
			if failures.Add(1) == 1 {
				return errors.New("stock service busy") // retried
			}
			note("release")
			return nil
		})
		_, err := workflow.Step(wctx, "ship", func(ctx context.Context) (int, error) {
			return 0, core.Permanent(errors.New("no courier"))
		}, nil)
		return "", err
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 50, nil)
	_, err := result[string](t, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunCompensated) || !strings.Contains(err.Error(), "no courier") {
		t.Fatalf("want compensated, got %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 2 || order[0] != "release" || order[1] != "refund" {
		t.Fatalf("compensation order %v", order)
	}
	if n := b.count(`SELECT coalesce(sum(amount), 99) FROM payments`); n != 0 {
		t.Fatalf("payments sum %d after refund", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key LIKE 'compensate:%' AND state = 'completed'`, h.ID); n != 2 {
		t.Fatalf("%d compensation checkpoints", n)
	}
}

// A run failed by its child is retried after its child: Retry the child,
// then the parent, which waits for the child again and completes.
func TestRetryParentAfterChild(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var broken atomic.Bool
	broken.Store(true)
	child := workflow.MustRegister(b.reg, "flaky-child", func(wctx workflow.Context, _ int) (string, error) {
		return workflow.Step(wctx, "work", func(ctx context.Context) (string, error) {
			if broken.Load() {
				return "", core.Permanent(errors.New("down"))
			}
			return "ok", nil
		}, nil)
	})
	parent := workflow.MustRegister(b.reg, "needs-child", func(wctx workflow.Context, _ int) (string, error) {
		return workflow.Child(wctx, "c", child, 0, nil).Get(wctx)
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "needs"})
	if _, err := result[string](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("want failed, got %v", err)
	}
	broken.Store(false)
	if err := workflow.Retry(ctx, b.pool, "needs/c"); err != nil {
		t.Fatal(err)
	}
	if err := workflow.Retry(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := result[string](t, b.pool, h.ID); err != nil || out != "ok" {
		t.Fatal(out, err)
	}
}

// A child started on another queue is picked up by the wake-up its
// parent's transaction sends after committing: the workers here never
// poll.
func TestChildStartWakesItsQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	email := workflow.MustRegister(b.reg, "email", func(wctx workflow.Context, to string) (string, error) {
		return workflow.Step(wctx, "send", func(ctx context.Context) (string, error) { return "sent to " + to, nil }, nil)
	})
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, to string) (string, error) {
		return workflow.Child(wctx, "mail", email, to, &workflow.ChildOpts{Queue: "email"}).Get(wctx)
	})
	b.startWith(&core.Config{PollInterval: time.Hour}, "default", "email")
	h, err := workflow.Start(context.Background(), b.pool, parent, "ann", nil)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := result[string](t, b.pool, h.ID); err != nil || out != "sent to ann" {
		t.Fatalf("%q, %v", out, err)
	}
}

// A child run deleted before its parent read its outcome is the parent's
// *ChildError (which it can handle, or compensate), not an error of every
// execution that spends the parent's attempts.
func TestDeletedChildIsAChildError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	kid := workflow.MustRegister(b.reg, "quick-kid", func(wctx workflow.Context, n int) (int, error) { return n, nil })
	var undone atomic.Int32
	wf := workflow.MustRegister(b.reg, "forgetful", func(wctx workflow.Context, _ int) (int, error) {
		workflow.Compensate(wctx, "undo", func(ctx context.Context) error { undone.Add(1); return nil })
		f := workflow.Child(wctx, "kid", kid, 7, nil)
		if _, _, err := workflow.WaitSignal[int](wctx, "go", 0); err != nil {
			return 0, err
		}
		return f.Get(wctx)
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "forgetful"})
	b.waitFor("the child finished", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'forgetful/kid' AND state = 'completed'`) == 1
	})
	if err := workflow.Delete(ctx, b.pool, "forgetful/kid"); err != nil {
		t.Fatal(err)
	}
	if err := workflow.Signal(ctx, b.pool, h.ID, "go", 1); err != nil {
		t.Fatal(err)
	}
	_, err := result[int](t, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunCompensated) || !strings.Contains(err.Error(), "forgetful/kid") {
		t.Fatalf("want compensated by a child error, got %v", err)
	}
	if n := b.count(`SELECT j.attempt FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id WHERE r.id = $1`, h.ID); n != 1 {
		t.Fatalf("parent job attempt %d, want 1", n)
	}
	if undone.Load() != 1 {
		t.Fatalf("compensation ran %d times", undone.Load())
	}
}

// A parent that ends without collecting a child's outcome (it completes,
// fails, or fails and compensates) cancels that child in the transaction
// that records its end: the child, waiting on a signal, ends cancelled and
// its own compensation runs, as for Cancel.
func TestParentEndCancelsUncollectedChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var unreserved, refunded atomic.Int32
	child := workflow.MustRegister(b.reg, "orphan", func(wctx workflow.Context, _ int) (int, error) {
		if _, err := workflow.Step(wctx, "reserve", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		workflow.Compensate(wctx, "unreserve", func(ctx context.Context) error { unreserved.Add(1); return nil })
		_, _, err := workflow.WaitSignal[int](wctx, "never", 0)
		return 0, err
	})
	parent := func(end string) *workflow.Workflow[int, int] {
		return workflow.MustRegister(b.reg, "parent-"+end, func(wctx workflow.Context, _ int) (int, error) {
			workflow.Child(wctx, "c", child, 0, nil)
			if end == "compensates" {
				if _, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
					return 0, err
				}
				workflow.Compensate(wctx, "refund", func(ctx context.Context) error { refunded.Add(1); return nil })
			}
			// Ends once the child waits, so that its compensation is due.
			if _, _, err := workflow.WaitSignal[int](wctx, "end", 0); err != nil {
				return 0, err
			}
			if end == "completes" {
				return 1, nil // returns without Get
			}
			return 0, errors.New("parent gives up")
		})
	}
	ends := map[string]error{"completes": nil, "fails": workflow.ErrRunFailed, "compensates": workflow.ErrRunCompensated}
	wfs := map[string]*workflow.Workflow[int, int]{}
	for end := range ends {
		wfs[end] = parent(end)
	}
	b.start()
	for end, want := range ends {
		h, err := workflow.Start(ctx, b.pool, wfs[end], 0, &workflow.StartOpts{ID: end})
		if err != nil {
			t.Fatal(err)
		}
		b.waitFor(end+": child waiting", func() bool {
			return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'signal:never#1' AND state = 'waiting'`, h.ID+"/c") == 1
		})
		if err := workflow.Signal(ctx, b.pool, h.ID, "end", 0); err != nil {
			t.Fatal(err)
		}
		if _, err := result[int](t, b.pool, h.ID); (want == nil && err != nil) || (want != nil && !errors.Is(err, want)) {
			t.Fatalf("%s: parent: want %v, got %v", end, want, err)
		}
		if _, err := result[int](t, b.pool, h.ID+"/c"); !errors.Is(err, workflow.ErrRunCancelled) {
			t.Fatalf("%s: child: want cancelled, got %v", end, err)
		}
	}
	if unreserved.Load() != 3 || refunded.Load() != 1 {
		t.Fatalf("child compensations ran %d times (want 3), parent's %d (want 1)", unreserved.Load(), refunded.Load())
	}
}

// A child collected by Get is not touched by its parent's end, and a run
// continuing as new cancels the children of the generation it leaves.
func TestContinueAsNewCancelsUncollectedChildren(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	done := workflow.MustRegister(b.reg, "quick", func(wctx workflow.Context, _ int) (int, error) { return 5, nil })
	waits := workflow.MustRegister(b.reg, "waits", func(wctx workflow.Context, _ int) (int, error) {
		_, _, err := workflow.WaitSignal[int](wctx, "never", 0)
		return 0, err
	})
	wf := workflow.MustRegister(b.reg, "looper", func(wctx workflow.Context, gen int) (int, error) {
		if gen == 1 {
			return 1, nil
		}
		v, err := workflow.Child(wctx, "quick", done, 0, nil).Get(wctx)
		if err != nil || v != 5 {
			return 0, errors.New("quick child did not complete")
		}
		workflow.Child(wctx, "waits", waits, 0, nil)
		return 0, workflow.ContinueAsNew(wctx, 1)
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "loop"})
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 1 {
		t.Fatal(out, err)
	}
	if _, err := result[int](t, b.pool, "loop/waits"); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("child of the old generation: want cancelled, got %v", err)
	}
	if out, err := result[int](t, b.pool, "loop/quick"); err != nil || out != 5 {
		t.Fatal("collected child:", out, err)
	}
}
