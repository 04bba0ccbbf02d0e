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

// Every refusal of RunNow
// (an id in use, a cancelled caller, a failed statement) gives back the
// worker slot Lend reserved. On a queue of one slot a leaked slot would
// make the next RunNow fall back to a queued start that no worker can
// take (the slot is gone), and Stop would wait for it forever.
func TestEagerRefusalsGiveTheSlotBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var callerRuns atomic.Int32
	wf := workflow.MustRegister(b.reg, "eager.slot", func(wctx workflow.Context, in int) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) {
			if inCaller(ctx) {
				callerRuns.Add(1)
			}
			return in, nil
		}, nil)
	})
	c := b.startWith(&core.Config{Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	ctx := callerCtx(t)
	if _, err := b.pool.Exec(ctx, `
		CREATE FUNCTION test_refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'boom refused'; END $$;
		CREATE TRIGGER test_refuse_boom BEFORE INSERT ON relay_workflow_runs
		    FOR EACH ROW WHEN (NEW.id LIKE 'boom%') EXECUTE FUNCTION test_refuse_boom();`); err != nil {
		t.Fatal(err)
	}
	if out, err := workflow.RunNow(ctx, c, wf, 1, &workflow.StartOpts{ID: "dup"}); err != nil || out != 1 {
		t.Fatalf("first: %d, %v", out, err)
	}
	for i := 0; i < 3; i++ {
		if out, err := workflow.RunNow(ctx, c, wf, 2, &workflow.StartOpts{ID: "dup"}); err != nil || out != 1 {
			t.Fatalf("duplicate %d: %d, %v", i, out, err)
		}
		if _, err := workflow.RunNow(ctx, c, wf, 2, &workflow.StartOpts{ID: "boom-" + string(rune('a'+i))}); err == nil {
			t.Fatalf("a refused insert returned no error")
		}
		gone, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := workflow.RunNow(gone, c, wf, 2, &workflow.StartOpts{ID: "gone"}); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled caller: %v", err)
		}
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs`); n != 1 {
		t.Fatalf("%d jobs, want the first run's only", n)
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out, err := workflow.RunNow(short, c, wf, 3, &workflow.StartOpts{ID: "after"}); err != nil || out != 3 {
		t.Fatalf("a run after the refusals: %d, %v (a slot leaked?)", out, err)
	}
	if callerRuns.Load() != 2 {
		t.Fatalf("%d runs in their caller, want 2: the last one had no slot", callerRuns.Load())
	}
	stop, cancelStop := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelStop()
	if err := c.Stop(stop); err != nil {
		t.Fatalf("Stop: %v (waiting for a reservation never given back?)", err)
	}
}

// A global limit on RunKind, or on the run's queue, is never bypassed:
// the run is inserted queued and a worker's claim, which honours the
// limit, takes it.
func TestEagerGlobalLimitNotBypassed(t *testing.T) {
	t.Parallel()
	for _, l := range []core.Limit{{Kind: workflow.RunKind, MaxRunning: 5}, {Queue: core.DefaultQueue, MaxRunning: 5}} {
		b := setup(t)
		var callerRuns atomic.Int32
		wf := workflow.MustRegister(b.reg, "eager.limit", func(wctx workflow.Context, in int) (int, error) {
			return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) {
				if inCaller(ctx) {
					callerRuns.Add(1)
				}
				return in, nil
			}, nil)
		})
		c := b.start()
		if err := core.SetLimit(context.Background(), b.pool, l); err != nil {
			t.Fatal(err)
		}
		if out, err := workflow.RunNow(callerCtx(t), c, wf, 4, nil); err != nil || out != 4 {
			t.Fatalf("limit %+v: %d, %v", l, out, err)
		}
		if callerRuns.Load() != 0 {
			t.Fatalf("limit %+v: the run executed in its caller, bypassing the limit", l)
		}
	}
}

// A client not started, or stopped, takes no eager run: RunNow starts the
// run queued (as documented) and nothing is claimed by that client.
func TestEagerClientNotRunningStartsQueued(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := workflow.MustRegister(b.reg, "eager.idle", func(wctx workflow.Context, in int) (int, error) { return in, nil })
	ws := core.NewWorkers()
	if err := b.reg.AddWorkers(ws); err != nil {
		t.Fatal(err)
	}
	c, err := core.NewClient(b.pool, &core.Config{Workers: ws, Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := workflow.RunNow(ctx, c, wf, 1, &workflow.StartOpts{ID: "not-started"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("not started: %v, want the wait's deadline", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs WHERE state = 'queued'`); n != 1 {
		t.Fatalf("%d queued jobs, want the run's", n)
	}
	// Started then stopped.
	c2 := b.startWith(&core.Config{Queues: map[string]core.QueueConfig{"q2": {MaxWorkers: 1}}})
	stop, cancelStop := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelStop()
	if err := c2.Stop(stop); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	if _, err := workflow.RunNow(ctx2, c2, wf, 1, &workflow.StartOpts{ID: "stopped", Queue: "q2"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stopped: %v, want the wait's deadline", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs WHERE state = 'queued' AND queue = 'q2'`); n != 1 {
		t.Fatalf("%d queued jobs on q2, want the run's", n)
	}
}

// A Cancel of a run executing in its caller ends it cancelled, and
// RunNow returns that outcome.
func TestEagerCancelWhileRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var second atomic.Int32
	wf := workflow.MustRegister(b.reg, "eager.cancel", func(wctx workflow.Context, _ int) (int, error) {
		if _, err := workflow.Step(wctx, "a", func(ctx context.Context) (int, error) {
			if err := workflow.Cancel(context.Background(), b.pool, wctx.RunID()); err != nil {
				return 0, err
			}
			return 1, nil
		}, nil); err != nil {
			return 0, err
		}
		return workflow.Step(wctx, "b", func(ctx context.Context) (int, error) { second.Add(1); return 2, nil }, nil)
	})
	c := b.start()
	_, err := workflow.RunNow(callerCtx(t), c, wf, 0, &workflow.StartOpts{ID: "cancel-me"})
	var re *workflow.RunError
	if !errors.As(err, &re) || re.State != workflow.StateCancelled {
		t.Fatalf("RunNow: %v, want the run cancelled", err)
	}
	if second.Load() != 0 {
		t.Fatalf("step b ran %d times after the cancel", second.Load())
	}
}

// An eager run's job read while it executes (as the admin API reads it):
// claimed, attempt 1, attempted_at and attempted_by set as a claim sets
// them.
func TestEagerJobReadWhileRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	wf := workflow.MustRegister(b.reg, "eager.admin", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) { <-release; return 1, nil }, nil)
	})
	c := b.startWith(&core.Config{ID: "eager-admin"})
	done := make(chan error, 1)
	go func() { _, err := workflow.RunNow(callerCtx(t), c, wf, 0, &workflow.StartOpts{ID: "adm"}); done <- err }()
	b.waitFor("the run's job", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'adm'`) == 1
	})
	var id int64
	if err := b.pool.QueryRow(context.Background(), `SELECT job_id FROM relay_workflow_runs WHERE id = 'adm'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	j, err := core.JobGet(context.Background(), b.pool, id)
	if err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if j.State != core.StateClaimed || j.Attempt != 1 || j.AttemptedBy != "eager-admin" || j.AttemptedAt.IsZero() ||
		j.AttemptedAt.Before(j.CreatedAt) || !j.RunAt.Equal(j.CreatedAt) {
		t.Fatalf("the eager job as the admin API reads it: %+v", j)
	}
}

// Eight callers RunNow the same new id at once on a queue of two slots:
// one run, one job, every caller gets its result, and no slot is lost
// (a last RunNow still runs in its caller).
func TestEagerSameIDStorm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs, callerRuns atomic.Int32
	wf := workflow.MustRegister(b.reg, "eager.storm", func(wctx workflow.Context, in int) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) {
			runs.Add(1)
			if inCaller(ctx) {
				callerRuns.Add(1)
			}
			time.Sleep(20 * time.Millisecond)
			return in, nil
		}, nil)
	})
	c := b.startWith(&core.Config{Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 2}}})
	ctx := callerCtx(t)
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		go func() {
			out, err := workflow.RunNow(ctx, c, wf, 3, &workflow.StartOpts{ID: "storm"})
			if err == nil && out != 3 {
				err = errors.New("wrong output")
			}
			errs <- err
		}()
	}
	for i := 0; i < 8; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs`); n != 1 || runs.Load() != 1 {
		t.Fatalf("%d jobs, step ran %d times", n, runs.Load())
	}
	// The storm's run ran in a caller, or in a worker when a fallback
	// Start won the id: either is right. Two more runs find free slots.
	before := callerRuns.Load()
	for i := 0; i < 2; i++ {
		if _, err := workflow.RunNow(ctx, c, wf, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := callerRuns.Load() - before; got != 2 {
		t.Fatalf("%d of the 2 runs after the storm ran in their callers: a slot was lost", got)
	}
}

// Stop while the eager insert is in flight: Stop waits for the
// reservation and the adopted job (a graceful stop lets a job in flight
// finish before its deadline): the run runs once, in the caller, and RunNow
// returns its result; Stop does not return before the insert answered.
func TestEagerStopWaitsForTheInsert(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(context.Background(), `
		CREATE FUNCTION test_slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$;
		CREATE TRIGGER test_slow_insert BEFORE INSERT ON relay_workflow_runs
		    FOR EACH ROW WHEN (NEW.id = 'slow') EXECUTE FUNCTION test_slow_insert();`); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	wf := workflow.MustRegister(b.reg, "eager.stop", func(wctx workflow.Context, in int) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) { runs.Add(1); return in, nil }, nil)
	})
	c := b.startWith(&core.Config{Queues: map[string]core.QueueConfig{"q": {MaxWorkers: 1}}})
	ctx := callerCtx(t)
	done := make(chan error, 1)
	var out int
	go func() {
		var err error
		out, err = workflow.RunNow(ctx, c, wf, 8, &workflow.StartOpts{ID: "slow", Queue: "q"})
		done <- err
	}()
	b.waitFor("the insert sleeping in its trigger", func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'`) == 1
	})
	stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	began := time.Now()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if time.Since(began) < 500*time.Millisecond {
		t.Fatalf("Stop returned after %s, before the reserved insert answered", time.Since(began))
	}
	if err := <-done; err != nil || out != 8 {
		t.Fatalf("RunNow: %d, %v", out, err)
	}
	if runs.Load() != 1 {
		t.Fatalf("step ran %d times", runs.Load())
	}
}

// A start of the same id in a transaction still open (the caller's own
// Start in its business transaction, committed 16 s later): RunNow waits
// for that transaction's row, as Start would, and then finds the run and
// returns its result. ctx (60 s) bounds the wait, as documented: no
// internal bound of RunNow's ends it with the caller's context still live.
// Nor does the wait hold a worker slot meanwhile: on a queue of one slot,
// another RunNow runs in its caller while the first waits.
func TestEagerWaitsForAnOpenStartOfTheSameID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var callerRuns atomic.Int32
	wf := workflow.MustRegister(b.reg, "eager.held", func(wctx workflow.Context, in int) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) {
			if inCaller(ctx) {
				callerRuns.Add(1)
			}
			return in, nil
		}, nil)
	})
	c := b.startWith(&core.Config{Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	ctx := callerCtx(t)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := workflow.Start(ctx, tx, wf, 5, &workflow.StartOpts{ID: "held"}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	done := make(chan error, 1)
	var out int
	go func() {
		var err error
		out, err = workflow.RunNow(ctx, c, wf, 9, &workflow.StartOpts{ID: "held"})
		done <- err
	}()
	// RunNow waits for the open start's row (past the eager statement's
	// brief lock wait, which sets lock_timeout: not that one).
	b.waitFor("RunNow waiting for the open start's row", func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
			AND query NOT LIKE '%set_config(''lock_timeout''%'`) == 1
	})
	if out, err := workflow.RunNow(ctx, c, wf, 1, nil); err != nil || out != 1 {
		t.Fatalf("another run meanwhile: %d, %v", out, err)
	}
	if callerRuns.Load() != 1 {
		t.Fatal("another run meanwhile did not run in its caller: the waiting RunNow holds the queue's one slot")
	}
	time.Sleep(time.Until(began.Add(16 * time.Second)))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || out != 5 {
		t.Fatalf("RunNow of an id whose start committed after 16 s: %d, %v (want the run's 5)", out, err)
	}
}

// A caller whose context ends while the eager statement is in flight gets
// its context's error once the statement answers (a cancel could hide its
// commit, so the statement is not cancelled); the job it committed claimed
// is handed back to the queue, not left claimed by nobody until its lease
// expires, and never executed in the gone caller: a worker runs the run to
// its end, once.
func TestEagerCallerGoneDuringTheInsert(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(context.Background(), `
		CREATE FUNCTION test_slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$;
		CREATE TRIGGER test_slow_insert BEFORE INSERT ON relay_workflow_runs
		    FOR EACH ROW WHEN (NEW.id = 'slow') EXECUTE FUNCTION test_slow_insert();`); err != nil {
		t.Fatal(err)
	}
	var runs, inGoneCaller atomic.Int32
	wf := workflow.MustRegister(b.reg, "eager.gone", func(wctx workflow.Context, in int) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) {
			if inCaller(ctx) {
				inGoneCaller.Add(1)
			}
			runs.Add(1)
			return in, nil
		}, nil)
	})
	c := b.startWith(&core.Config{LeaseDuration: time.Minute})
	ctx, cancel := context.WithCancel(callerCtx(t))
	done := make(chan error, 1)
	go func() { _, err := workflow.RunNow(ctx, c, wf, 6, &workflow.StartOpts{ID: "slow"}); done <- err }()
	b.waitFor("the insert sleeping in its trigger", func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'`) == 1
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("RunNow: %v, want context.Canceled", err)
	}
	b.waitFor("the statement committed", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'slow'`) == 1
	})
	if out, err := result[int](t, b.pool, "slow"); err != nil || out != 6 {
		t.Fatalf("the run: %d, %v", out, err)
	}
	if runs.Load() != 1 || inGoneCaller.Load() != 0 {
		t.Fatalf("step ran %d times, %d of them in the gone caller", runs.Load(), inGoneCaller.Load())
	}
}
