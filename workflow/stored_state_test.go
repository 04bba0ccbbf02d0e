package workflow_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/workflow"
)

// A step row written by hand with a state or kind the package does not
// know (an operator "fixing" a run in SQL) fails that run alone with an
// error naming the row, on the replay that reads it: a completed StepTx
// is never run again because its state was overwritten, and the runs
// beside it go on.
func TestStepRowOfUnknownStateOrKindFailsItsRunAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.exec(`CREATE TABLE effects (run_id text)`)
	wf := workflow.MustRegister(b.reg, "booked", func(wctx workflow.Context, in int) (int, error) {
		n, err := workflow.StepTx(wctx, "book", func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, wctx.RunID())
			return in + 1, err
		}, nil)
		if err != nil {
			return 0, err
		}
		_, _, err = workflow.WaitSignal[int](wctx, "go", 0)
		return n, err
	})
	b.start()
	ids := []string{"bad-state", "bad-kind", "good"}
	for _, id := range ids {
		if _, err := workflow.Start(ctx, b.pool, wf, 1, &workflow.StartOpts{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	b.waitFor("three runs waiting", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE state = 'waiting'`) == 3
	})
	b.exec(`UPDATE relay_workflow_steps SET state = 'done' WHERE run_id = 'bad-state' AND key = 'book'`)
	b.exec(`UPDATE relay_workflow_steps SET kind = 'stepx' WHERE run_id = 'bad-kind' AND key = 'book'`)
	for _, id := range ids {
		if err := workflow.Signal(ctx, b.pool, id, "go", 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := result[int](t, b.pool, "bad-state"); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), `"done"`) {
		t.Fatalf("bad-state: %v; want it failed naming the state", err)
	}
	if _, err := result[int](t, b.pool, "bad-kind"); !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("bad-kind: %v; want it failed", err)
	}
	if out, err := result[int](t, b.pool, "good"); err != nil || out != 2 {
		t.Fatalf("good: %d, %v", out, err)
	}
	for _, id := range ids {
		if n := b.count(`SELECT count(*) FROM effects WHERE run_id = $1`, id); n != 1 {
			t.Fatalf("%s: the StepTx's effect is there %d times", id, n)
		}
	}
}
