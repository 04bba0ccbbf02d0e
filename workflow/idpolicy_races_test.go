package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/workflow"
)

// A start with IDConflictTerminateExisting while the run it replaces is
// inside a StepTx: the start waits for that StepTx's commit, then decides
// under the run's row lock. Whichever way the race after goes (the old run
// terminated and replaced, or finished first and returned as the existing
// run), no step of one run reaches the other's history under the shared
// id, and every StepTx effect is there once.
func TestTerminateExistingWhileItsStepTxRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.exec(`CREATE TABLE effects (run_id text, input int, step text)`)
	g := newGate()
	wf := workflow.MustRegister(b.reg, "replaced", func(wctx workflow.Context, n int) (int, error) {
		for _, key := range []string{"s0", "s1", "s2"} {
			if _, err := workflow.StepTx(wctx, key, func(ctx context.Context, tx pgx.Tx) (int, error) {
				if n == 1 && key == "s0" {
					g.pass()
				}
				_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2, $3)`, wctx.RunID(), n, key)
				return n, err
			}, nil); err != nil {
				return 0, err
			}
		}
		return n, nil
	})
	b.start()
	if _, err := workflow.Start(ctx, b.pool, wf, 1, &workflow.StartOpts{ID: "x"}); err != nil {
		t.Fatal(err)
	}
	g.waitEntered(t)
	started := make(chan error, 1)
	go func() {
		_, err := workflow.Start(ctx, b.pool, wf, 2, &workflow.StartOpts{ID: "x", IDConflict: workflow.IDConflictTerminateExisting})
		started <- err
	}()
	b.waitFor("the start waits for the old run's StepTx", func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO relay_workflow_runs%'`) > 0
	})
	close(g.open)
	select {
	case err := <-started:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the start did not return")
	}
	out, err := result[int](t, b.pool, "x")
	if err != nil || (out != 1 && out != 2) {
		t.Fatalf("run x ended %d, %v", out, err)
	}
	b.waitFor("the old run's job ended", func() bool {
		return b.count(`SELECT count(*) FROM relay_jobs WHERE args->>'run_id' = 'x' AND state IN ('claimed', 'queued', 'scheduled', 'retryable')`) == 0
	})
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'x' AND output::int <> $1`, out); n != 0 {
		t.Fatalf("%d steps of the other run in the history of run x (output %d)", n, out)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'x'`); n != 3 {
		t.Fatalf("run x's history holds %d steps, want its own 3", n)
	}
	if n, d := b.count(`SELECT count(*) FROM effects`), b.count(`SELECT count(DISTINCT (input, step)) FROM effects`); n != d {
		t.Fatalf("%d effects, %d distinct: one made twice", n, d)
	}
	t.Logf("run x ended %d (2: replaced)", out)
}

// A run id reused with IDReuseAllow starts from an empty mailbox: a
// signal the old run never consumed is not the new run's.
func TestReusedIDGetsNoSignalOfTheOldRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "mailbox", func(wctx workflow.Context, n int) (int, error) {
		if n == 1 {
			return 1, nil // ends without reading its mailbox
		}
		v, ok, err := workflow.WaitSignal[int](wctx, "v", 0)
		if err != nil || !ok {
			return 0, err
		}
		return v, nil
	})
	if _, err := workflow.Start(ctx, b.pool, wf, 1, &workflow.StartOpts{ID: "m"}); err != nil {
		t.Fatal(err)
	}
	if err := workflow.Signal(ctx, b.pool, "m", "v", 99); err != nil {
		t.Fatal(err)
	}
	b.start()
	if out, err := result[int](t, b.pool, "m"); err != nil || out != 1 {
		t.Fatalf("the old run ended %d, %v", out, err)
	}
	if _, err := workflow.Start(ctx, b.pool, wf, 2, &workflow.StartOpts{ID: "m", IDReuse: workflow.IDReuseAllow}); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the new run waits for its own signal", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'm' AND state = 'waiting'`) == 1
	})
	if err := workflow.Signal(ctx, b.pool, "m", "v", 5); err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, b.pool, "m"); err != nil || out != 5 {
		t.Fatalf("the new run ended %d, %v; want its own signal's 5, not the old run's 99", out, err)
	}
}
