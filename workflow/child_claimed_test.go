package workflow_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// logJobWrites records every insert of a job row (its state) and every
// update that changes a job's state, per job, in job_writes.
func logJobWrites(t *testing.T, b *bundle) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), `
		CREATE TABLE job_writes (n serial, job_id bigint, write text);
		CREATE FUNCTION log_job_write() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF TG_OP = 'INSERT' THEN
				INSERT INTO job_writes (job_id, write) VALUES (NEW.id, 'insert ' || NEW.state);
			ELSIF OLD.state <> NEW.state THEN
				INSERT INTO job_writes (job_id, write) VALUES (NEW.id, OLD.state || '>' || NEW.state);
			END IF;
			RETURN NULL;
		END $$;
		CREATE TRIGGER log_job_write AFTER INSERT OR UPDATE ON relay_jobs FOR EACH ROW EXECUTE FUNCTION log_job_write();`); err != nil {
		t.Fatal(err)
	}
}

// jobWrites is the writes logJobWrites recorded for run id's job, in order.
func jobWrites(t *testing.T, b *bundle, id string) string {
	t.Helper()
	var got string
	if err := b.pool.QueryRow(context.Background(), `
		SELECT coalesce(string_agg(w.write, ', ' ORDER BY w.n), '') FROM job_writes AS w
		WHERE w.job_id = (SELECT job_id FROM relay_workflow_runs WHERE id = $1)`, id).Scan(&got); err != nil {
		t.Fatal(err)
	}
	return got
}

// A child whose Get is the parent's next primitive is started with its
// job inserted already claimed by the client executing the parent, for
// the parent's slot: the job's row is written once claimed and once
// succeeded, with no queued version and no claim's update in between. Its
// claim is the one a fetch loop makes (attempt 1, the client's id and a
// lease), and the client's heartbeats and outcome fence apply to it.
func TestChildAwaitedAtOnceIsInsertedClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	logJobWrites(t, b)
	noop := workflow.MustRegister(b.reg, "noop", func(wctx workflow.Context, n int) (int, error) {
		return workflow.Step(wctx, "s", func(context.Context) (int, error) { return n, nil }, nil)
	})
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, _ int) (int, error) {
		sum := 0
		for i, k := range []string{"a", "b", "c"} {
			v, err := workflow.Child(wctx, k, noop, i+1, nil).Get(wctx)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	})
	b.startWith(&core.Config{ID: "inliner", Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	if _, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, b.pool, "p"); err != nil || out != 6 {
		t.Fatalf("%d %v", out, err)
	}
	for _, id := range []string{"p/a", "p/b", "p/c"} {
		b.waitFor(id+"'s job succeeded", func() bool {
			return b.count(`SELECT count(*) FROM relay_jobs WHERE id = (SELECT job_id FROM relay_workflow_runs WHERE id = $1) AND state = 'succeeded'`, id) == 1
		})
		if got := jobWrites(t, b, id); got != "insert claimed, claimed>succeeded" {
			t.Errorf("%s's job was written %q, want inserted claimed and then succeeded", id, got)
		}
		if n := b.count(`SELECT count(*) FROM relay_jobs WHERE id = (SELECT job_id FROM relay_workflow_runs WHERE id = $1)
			AND attempt = 1 AND attempted_by = 'inliner' AND attempted_at IS NOT NULL`, id); n != 1 {
			t.Errorf("%s's job is not one attempt claimed by the parent's client", id)
		}
	}
	if st := b.reg.Stats(); st.Suspended != 0 || st.Executions != 4 {
		t.Fatalf("stats %+v: want 4 executions, none suspended", st)
	}
}

// Children started together and then collected (Child, Child, Get, Get)
// are started as before: the second Child writes the first's start, the
// first Get the second's, each job inserted queued; each child runs once
// and completes once.
func TestChildFanOutStartsEachChildOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	logJobWrites(t, b)
	var ran sync.Map
	kid := workflow.MustRegister(b.reg, "kid", func(wctx workflow.Context, n int) (int, error) {
		return workflow.Step(wctx, "s", func(context.Context) (int, error) {
			v, _ := ran.LoadOrStore(wctx.RunID(), new(atomic.Int32))
			v.(*atomic.Int32).Add(1)
			return n * 10, nil
		}, nil)
	})
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, _ int) (int, error) {
		fa := workflow.Child(wctx, "a", kid, 1, nil)
		fb := workflow.Child(wctx, "b", kid, 2, nil)
		a, err := fa.Get(wctx)
		if err != nil {
			return 0, err
		}
		bv, err := fb.Get(wctx)
		return a + bv, err
	})
	b.startWith(&core.Config{Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 2}}})
	if _, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, b.pool, "p"); err != nil || out != 30 {
		t.Fatalf("%d %v", out, err)
	}
	for _, id := range []string{"p/a", "p/b"} {
		if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1 AND state = 'completed' AND executions = 1`, id); n != 1 {
			t.Errorf("%s did not complete in one execution", id)
		}
		if v, ok := ran.Load(id); !ok || v.(*atomic.Int32).Load() != 1 {
			t.Errorf("%s's step did not run exactly once", id)
		}
		b.waitFor(id+"'s job succeeded", func() bool {
			return b.count(`SELECT count(*) FROM relay_jobs WHERE id = (SELECT job_id FROM relay_workflow_runs WHERE id = $1) AND state = 'succeeded'`, id) == 1
		})
		if got := jobWrites(t, b, id); got != "insert queued, queued>claimed, claimed>succeeded" {
			t.Errorf("%s's job was written %q, want inserted queued, claimed, succeeded", id, got)
		}
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE parent_id = 'p'`); n != 2 {
		t.Fatalf("%d children, want 2", n)
	}
}

// A child started last, its Get never called, is started when the
// parent's function returns: an abandoned child then runs from its queue
// to its end after its parent completed.
func TestChildStartedByTheFunctionsReturn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	kid := workflow.MustRegister(b.reg, "kid", func(wctx workflow.Context, n int) (int, error) {
		return workflow.Step(wctx, "s", func(context.Context) (int, error) { return n, nil }, nil)
	})
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, _ int) (string, error) {
		workflow.Child(wctx, "a", kid, 5, &workflow.ChildOpts{ParentClose: workflow.ParentCloseAbandon})
		return "done", nil
	})
	b.start()
	if _, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	if out, err := result[string](t, b.pool, "p"); err != nil || out != "done" {
		t.Fatalf("%q %v", out, err)
	}
	if out, err := result[int](t, b.pool, "p/a"); err != nil || out != 5 {
		t.Fatalf("child: %d %v", out, err)
	}
}

// A cancel of the parent committed while the parent's function runs
// between a child's Child and its Get (the start deferred, nothing
// written): the start, written with the child's job claimed, asks the
// child to cancel too, so the child executed in the parent's slot runs no
// step, and both end cancelled. An abandoned child (ParentCloseAbandon)
// is not the parent's to cancel, as Cancel's own cascade skips it
// (relay_workflow_request_cancel): it runs to its end. Until
// sqlStartChildClaimed left an abandoned child's flag alone, it was
// cancelled before its first step too.
func TestDeferredChildStartSeesACancelCommittedBeforeIt(t *testing.T) {
	t.Parallel()
	for _, policy := range []workflow.ParentClosePolicy{workflow.ParentCloseCancel, workflow.ParentCloseAbandon} {
		abandon := policy == workflow.ParentCloseAbandon
		t.Run(map[bool]string{false: "cancel", true: "abandon"}[abandon], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			var charged atomic.Int32
			reached, gate := make(chan struct{}), make(chan struct{})
			var once sync.Once
			kid := workflow.MustRegister(b.reg, "kid", func(wctx workflow.Context, _ int) (int, error) {
				return workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) { charged.Add(1); return 1, nil }, nil)
			})
			parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, _ int) (int, error) {
				f := workflow.Child(wctx, "c", kid, 0, &workflow.ChildOpts{ParentClose: policy})
				once.Do(func() { close(reached) })
				select {
				case <-gate:
				case <-wctx.Done():
					return 0, wctx.Err()
				}
				return f.Get(wctx)
			})
			b.startWith(&core.Config{Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
			h, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "p"})
			if err != nil {
				t.Fatal(err)
			}
			<-reached
			if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'p/c'`); n != 0 {
				t.Fatal("the child's start was written at Child, not deferred to its Get")
			}
			if err := workflow.Cancel(ctx, b.pool, h.ID); err != nil {
				t.Fatal(err)
			}
			close(gate)
			_, perr := result[int](t, b.pool, h.ID)
			out, cerr := result[int](t, b.pool, "p/c")
			if !errors.Is(perr, workflow.ErrRunCancelled) {
				t.Errorf("parent: want cancelled, got %v", perr)
			}
			switch {
			case abandon && (cerr != nil || out != 1 || charged.Load() != 1):
				t.Errorf("abandoned child: got %d, %v (step ran %d times); want completed 1, as Cancel leaves an abandoned child alone", out, cerr, charged.Load())
			case !abandon && charged.Load() != 0:
				t.Errorf("the child's step ran %d times after its parent's cancel had committed, want 0", charged.Load())
			case !abandon && !errors.Is(cerr, workflow.ErrRunCancelled):
				t.Errorf("child: want cancelled, got %v", cerr)
			}
		})
	}
}

// A child awaited at once on a queue that a pause or a global limit holds
// is not inserted claimed: its job is inserted queued (the refusals of a
// claim), the parent suspends, and the child runs from the queue once
// the queue's workers may claim it.
func TestChildAwaitedAtOnceNeverBypassesAPauseOrALimit(t *testing.T) {
	t.Parallel()
	for _, hold := range []string{"pause", "limit"} {
		t.Run(hold, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			logJobWrites(t, b)
			var ran atomic.Int32
			reached, gate := make(chan struct{}), make(chan struct{})
			var once sync.Once
			kid := workflow.MustRegister(b.reg, "kid", func(wctx workflow.Context, _ int) (int, error) {
				return workflow.Step(wctx, "work", func(ctx context.Context) (int, error) { ran.Add(1); return 3, nil }, nil)
			})
			parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, _ int) (int, error) {
				f := workflow.Child(wctx, "c", kid, 0, nil)
				once.Do(func() { close(reached) })
				select {
				case <-gate:
				case <-wctx.Done():
					return 0, wctx.Err()
				}
				return f.Get(wctx)
			})
			b.startWith(&core.Config{Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
			h, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "p"})
			if err != nil {
				t.Fatal(err)
			}
			<-reached
			switch hold {
			case "pause":
				if _, err := core.PauseQueue(ctx, b.pool, core.DefaultQueue, "test"); err != nil {
					t.Fatal(err)
				}
			case "limit":
				// Limited claims take the parent's job again, after its
				// suspension, and the child.
				if err := core.SetLimit(ctx, b.pool, core.Limit{Kind: workflow.RunKind, MaxRunning: 1}); err != nil {
					t.Fatal(err)
				}
			}
			close(gate)
			b.waitFor("the parent suspended", func() bool { return b.reg.Stats().Suspended >= 1 })
			if hold == "pause" {
				if n := ran.Load(); n != 0 {
					t.Fatalf("the child ran %d times on a paused queue", n)
				}
				if _, err := core.ResumeQueue(ctx, b.pool, core.DefaultQueue); err != nil {
					t.Fatal(err)
				}
			}
			if out, err := result[int](t, b.pool, h.ID); err != nil || out != 3 {
				t.Fatalf("%d %v", out, err)
			}
			if got := jobWrites(t, b, "p/c"); len(got) < len("insert queued") || got[:len("insert queued")] != "insert queued" {
				t.Errorf("the child's job was written %q, want inserted queued first", got)
			}
			if n := ran.Load(); n != 1 {
				t.Errorf("the child's step ran %d times, want 1", n)
			}
		})
	}
}

// The process executing a parent and, in its slot, the parent's child
// inserted claimed dies while the child runs (both leases expire): the
// child's job is an ordinary claimed job, which the rescuer requeues; a
// worker runs the child again, its StepTx commits once, and the parent's
// rescued execution collects its outcome.
func TestCrashWhileAnInsertedClaimedChildRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	createPayments(t, b)
	var runs atomic.Int32
	kid := workflow.MustRegister(b.reg, "kid", func(wctx workflow.Context, amount int) (int, error) {
		return workflow.StepTx(wctx, "charge", func(ctx context.Context, tx pgx.Tx) (int, error) {
			if runs.Add(1) == 1 {
				// The process dies now: neither lease is renewed again.
				b.rescueNow("p")
				b.rescueNow(wctx.RunID())
			}
			_, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1, $2)`, wctx.RunID(), amount)
			return amount, err
		}, nil)
	})
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, amount int) (int, error) {
		return workflow.Child(wctx, "c", kid, amount, nil).Get(wctx)
	})
	logJobWrites(t, b)
	b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 2}}})
	if _, err := workflow.Start(ctx, b.pool, parent, 7, &workflow.StartOpts{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, b.pool, "p"); err != nil || out != 7 {
		t.Fatalf("parent: %d %v", out, err)
	}
	if n := b.count(`SELECT count(*) FROM payments`); n != 1 {
		t.Fatalf("%d payments, want exactly 1", n)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("the child's StepTx ran %d times, want 2 (the dead execution's, then the rescued one's)", n)
	}
	got := jobWrites(t, b, "p/c")
	if want := "insert claimed, claimed>queued, queued>claimed"; len(got) < len(want) || got[:len(want)] != want {
		t.Errorf("the child's job was written %q, want inserted claimed, requeued by the rescuer, claimed again", got)
	}
}
