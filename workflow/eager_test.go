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

type eagerCallerKey struct{}

// callerCtx is a context whose value a step sees only when it runs in the
// eager caller's own execution (a worker's context does not carry it).
func callerCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), eagerCallerKey{}, true), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func inCaller(ctx context.Context) bool { return ctx.Value(eagerCallerKey{}) != nil }

// A run started with RunNow runs to its end in the caller's own call:
// one execution, its job claimed by the caller's client at insert (attempt
// 1) and recorded succeeded, the output returned.
func TestEagerRunCompletesInCaller(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var outside atomic.Int32
	wf := workflow.MustRegister(b.reg, "eager.chain", func(wctx workflow.Context, in int) (int, error) {
		for _, k := range []string{"s1", "s2", "s3"} {
			v, err := workflow.Step(wctx, k, func(ctx context.Context) (int, error) {
				if !inCaller(ctx) {
					outside.Add(1)
				}
				return 1, nil
			}, nil)
			if err != nil {
				return 0, err
			}
			in += v
		}
		return in, nil
	})
	c := b.startWith(&core.Config{ID: "eager-caller"})
	out, err := workflow.RunNow(callerCtx(t), c, wf, 10, &workflow.StartOpts{ID: "eager-1"})
	if err != nil || out != 13 {
		t.Fatalf("RunNow: %d, %v", out, err)
	}
	if outside.Load() != 0 {
		t.Fatalf("%d steps ran outside the caller's execution", outside.Load())
	}
	if s := b.reg.Stats(); s.Executions != 1 || s.Suspended != 0 {
		t.Fatalf("stats %+v, want one execution", s)
	}
	// The run's job was the caller's claim: attempt 1 by this client.
	var jobs int
	var state, by string
	var attempt int
	if err := b.pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM relay_jobs), j.state, j.attempted_by, j.attempt
		FROM relay_workflow_runs AS r JOIN relay_jobs AS j ON j.id = r.job_id WHERE r.id = 'eager-1'`).
		Scan(&jobs, &state, &by, &attempt); err != nil {
		t.Fatal(err)
	}
	if jobs != 1 || by != "eager-caller" || attempt != 1 {
		t.Fatalf("%d jobs; the run's job %s by %q attempt %d", jobs, state, by, attempt)
	}
	b.waitFor("the run's job recorded succeeded", func() bool {
		return b.count(`SELECT count(*) FROM relay_jobs WHERE state = 'succeeded'`) == 1
	})
	// Result reads the same outcome.
	if out, err := result[int](t, b.pool, "eager-1"); err != nil || out != 13 {
		t.Fatalf("Result: %d, %v", out, err)
	}
}

// A run that sleeps suspends as usual: its job goes back to the queue, a
// worker's execution finishes it, and RunNow returns that result.
func TestEagerRunSleepsThenFinishesViaQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var firstInCaller, secondInCaller atomic.Bool
	wf := workflow.MustRegister(b.reg, "eager.sleep", func(wctx workflow.Context, _ int) (string, error) {
		if _, err := workflow.Step(wctx, "before", func(ctx context.Context) (int, error) {
			firstInCaller.Store(inCaller(ctx))
			return 0, nil
		}, nil); err != nil {
			return "", err
		}
		if err := workflow.Sleep(wctx, "nap", 100*time.Millisecond); err != nil {
			return "", err
		}
		return workflow.Step(wctx, "after", func(ctx context.Context) (string, error) {
			secondInCaller.Store(inCaller(ctx))
			return "woke", nil
		}, nil)
	})
	c := b.start()
	out, err := workflow.RunNow(callerCtx(t), c, wf, 0, nil)
	if err != nil || out != "woke" {
		t.Fatalf("RunNow: %q, %v", out, err)
	}
	if !firstInCaller.Load() || secondInCaller.Load() {
		t.Fatalf("first step in caller %v (want true), second %v (want false: a worker's execution)", firstInCaller.Load(), secondInCaller.Load())
	}
	if s := b.reg.Stats(); s.Executions < 2 || s.Suspended < 1 {
		t.Fatalf("stats %+v: want a suspension and a second execution", s)
	}
}

// The caller's execution dies mid-run (its lease taken away, as a rescue
// after a crash does, right after the first checkpoint committed): its
// late checkpoint is refused, the rescued run resumes after that
// checkpoint in a worker, and RunNow returns the run's result.
func TestEagerRunKilledIsRecovered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var a, c atomic.Int32
	wf := workflow.MustRegister(b.reg, "eager.resume", func(wctx workflow.Context, _ int) (int, error) {
		x, err := workflow.Step(wctx, "a", func(ctx context.Context) (int, error) { return int(a.Add(1)), nil }, nil)
		if err != nil {
			return 0, err
		}
		y, err := workflow.Step(wctx, "b", func(ctx context.Context) (int, error) {
			if c.Add(1) == 1 {
				b.rescueNow(wctx.RunID()) // "a" is committed; the caller's process dies now
				return 0, errors.New("killed")
			}
			return 10, nil
		}, nil)
		return x + y, err
	})
	client := b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	out, err := workflow.RunNow(callerCtx(t), client, wf, 0, nil)
	if err != nil || out != 11 {
		t.Fatalf("RunNow: %d, %v", out, err)
	}
	if a.Load() != 1 || c.Load() != 2 {
		t.Fatalf("a ran %d times (want 1), b %d (want 2)", a.Load(), c.Load())
	}
	if s := b.reg.Stats(); s.Executions != 2 {
		t.Fatalf("stats %+v, want 2 executions", s)
	}
}

// Starting an id that exists runs nothing and returns the existing run's
// result; the same id for another workflow is ErrIDInUse. No job is left
// behind by the refused starts.
func TestEagerDuplicateRunID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	wf := workflow.MustRegister(b.reg, "eager.once", func(wctx workflow.Context, in int) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) { calls.Add(1); return in * 2, nil }, nil)
	})
	other := workflow.MustRegister(b.reg, "eager.other", func(wctx workflow.Context, in int) (int, error) { return in, nil })
	c := b.start()
	ctx := callerCtx(t)
	opts := &workflow.StartOpts{ID: "order-7"}
	if out, err := workflow.RunNow(ctx, c, wf, 21, opts); err != nil || out != 42 {
		t.Fatalf("first: %d, %v", out, err)
	}
	if out, err := workflow.RunNow(ctx, c, wf, 99, opts); err != nil || out != 42 {
		t.Fatalf("again: %d, %v (want the existing run's 42)", out, err)
	}
	if _, err := workflow.RunNow(ctx, c, other, 1, opts); !errors.Is(err, workflow.ErrIDInUse) {
		t.Fatalf("another workflow's id: %v, want ErrIDInUse", err)
	}
	if calls.Load() != 1 {
		t.Fatalf("the step ran %d times", calls.Load())
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs`); n != 1 {
		t.Fatalf("%d jobs, want the first run's only", n)
	}
	// A duplicate of a run still executing waits for it.
	release := make(chan struct{})
	slow := workflow.MustRegister(b.reg, "eager.slow", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) { <-release; return 5, nil }, nil)
	})
	first := make(chan error, 1)
	go func() {
		_, err := workflow.RunNow(ctx, c, slow, 0, &workflow.StartOpts{ID: "slow-1"})
		first <- err
	}()
	b.waitFor("the slow run started", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'slow-1'`) == 1
	})
	time.AfterFunc(50*time.Millisecond, func() { close(release) })
	if out, err := workflow.RunNow(ctx, c, slow, 0, &workflow.StartOpts{ID: "slow-1"}); err != nil || out != 5 {
		t.Fatalf("duplicate of a running run: %d, %v", out, err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// With every worker slot of the queue busy, or the queue paused, RunNow
// starts the run queued and waits for it: no slot or pause is bypassed.
func TestEagerFallsBackToQueuedStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	var callerRuns atomic.Int32
	wf := workflow.MustRegister(b.reg, "eager.fallback", func(wctx workflow.Context, block bool) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) {
			if inCaller(ctx) {
				callerRuns.Add(1)
			}
			if block {
				<-release
			}
			return 1, nil
		}, nil)
	})
	c := b.startWith(&core.Config{Queues: map[string]core.QueueConfig{"one": {MaxWorkers: 1}}})
	ctx := callerCtx(t)
	opts := func() *workflow.StartOpts { return &workflow.StartOpts{Queue: "one"} }
	first := make(chan error, 1)
	go func() { _, err := workflow.RunNow(ctx, c, wf, true, opts()); first <- err }()
	b.waitFor("the first run holds the slot", func() bool { return callerRuns.Load() == 1 })
	second := make(chan error, 1)
	go func() { _, err := workflow.RunNow(ctx, c, wf, false, opts()); second <- err }()
	b.waitFor("the second run started queued", func() bool {
		return b.count(`SELECT count(*) FROM relay_jobs WHERE state = 'queued'`) == 1
	})
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if callerRuns.Load() != 1 {
		t.Fatalf("%d runs executed in their callers, want 1 (the second had no slot)", callerRuns.Load())
	}

	// Paused: started queued, finished once the queue resumes.
	if _, err := core.PauseQueue(context.Background(), b.pool, "one", "test"); err != nil {
		t.Fatal(err)
	}
	paused := make(chan error, 1)
	go func() { _, err := workflow.RunNow(ctx, c, wf, false, opts()); paused <- err }()
	b.waitFor("the run started queued on the paused queue", func() bool {
		return b.count(`SELECT count(*) FROM relay_jobs WHERE state = 'queued'`) == 1
	})
	if _, err := core.ResumeQueue(context.Background(), b.pool, "one"); err != nil {
		t.Fatal(err)
	}
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
	if callerRuns.Load() != 1 {
		t.Fatal("a run on the paused queue executed in its caller")
	}

	// A queue the client does not serve is an error, and nothing is written.
	if _, err := workflow.RunNow(ctx, c, wf, false, &workflow.StartOpts{Queue: "elsewhere"}); !errors.Is(err, workflow.ErrNotWorked) {
		t.Fatalf("unserved queue: %v, want workflow.ErrNotWorked", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE queue = 'elsewhere'`); n != 0 {
		t.Fatalf("%d runs written for an unserved queue", n)
	}
}

// When the caller stops waiting mid-run, its execution is cancelled and
// handed back to the queue; a worker finishes the run.
func TestEagerCallerGoneRunContinues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(callerCtx(t))
	wf := workflow.MustRegister(b.reg, "eager.abandoned", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) {
			if inCaller(ctx) {
				cancel() // the caller leaves while this step runs
				<-ctx.Done()
				return 0, ctx.Err()
			}
			return 7, nil
		}, nil)
	})
	c := b.start()
	if _, err := workflow.RunNow(ctx, c, wf, 0, &workflow.StartOpts{ID: "left"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("RunNow after its caller left: %v", err)
	}
	if out, err := result[int](t, b.pool, "left"); err != nil || out != 7 {
		t.Fatalf("the run after its caller left: %d, %v", out, err)
	}
	// The interrupted attempt was not the step's failure.
	if n := b.count(`SELECT attempts FROM relay_workflow_steps WHERE run_id = 'left' AND key = 's'`); n != 1 {
		t.Fatalf("step attempts %d, want 1", n)
	}
}

// RunNow writes the run's job once, already claimed: the job's row sees no
// claim (no queued>claimed update), only its outcome.
func TestEagerStartInsertsTheJobClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `
		CREATE TABLE test_job_updates (id bigint, change text);
		CREATE FUNCTION test_job_updated() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		    INSERT INTO test_job_updates VALUES (NEW.id, OLD.state || '>' || NEW.state);
		    RETURN NULL;
		END $$;
		CREATE TRIGGER test_job_updated AFTER UPDATE ON relay_jobs
		    FOR EACH ROW EXECUTE FUNCTION test_job_updated();`); err != nil {
		t.Fatal(err)
	}
	wf := workflow.MustRegister(b.reg, "eager.once", func(wctx workflow.Context, in int) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) { return in + 1, nil }, nil)
	})
	c := b.startWith(&core.Config{ID: "eager-once"})
	if out, err := workflow.RunNow(callerCtx(t), c, wf, 1, &workflow.StartOpts{ID: "eager-once-1"}); err != nil || out != 2 {
		t.Fatalf("RunNow: %d, %v", out, err)
	}
	b.waitFor("the run's job recorded succeeded", func() bool {
		return b.count(`SELECT count(*) FROM relay_jobs WHERE state = 'succeeded'`) == 1
	})
	var changes []string
	if err := b.pool.QueryRow(ctx, `
		SELECT coalesce((SELECT array_agg(u.change ORDER BY u.change) FROM test_job_updates AS u WHERE u.id = j.id), '{}')
		FROM relay_workflow_runs AS r JOIN relay_jobs AS j ON j.id = r.job_id WHERE r.id = 'eager-once-1'`).
		Scan(&changes); err != nil {
		t.Fatal(err)
	}
	if len(changes) != 1 || changes[0] != "claimed>succeeded" {
		t.Fatalf("the eager job's updates: %v, want only its outcome (claimed>succeeded): it was inserted claimed", changes)
	}
}
