package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/relayq/relay/workflow"
)

// deepJSON is a payload nested n deep: [[[…"x"…]]].
func deepJSON(n int) string {
	return strings.Repeat("[", n) + `"x"` + strings.Repeat("]", n)
}

// A signal whose payload does not decode into the wait's type (a wrong
// type; a 30 KB payload nested 5,000 deep, written past Signal's bounds)
// is set aside with its decoding error, and the run waits on: the good
// signal after them is the one received, and the run completes.
func TestBadSignalIsSetAside(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "approve-once", func(wctx workflow.Context, _ int) (string, error) {
		a, ok, err := workflow.WaitSignal[approval](wctx, "approve", 0)
		if err != nil || !ok {
			return "", errors.New("wait failed: " + errString(err))
		}
		return a.By, nil
	})
	h, err := workflow.Start(ctx, b.pool, wf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := workflow.Signal(ctx, b.pool, h.ID, "approve", "not an approval"); err != nil {
		t.Fatal(err)
	}
	deep := deepJSON(5000) + strings.Repeat(" ", 20000) // 30 KB
	if _, err := b.pool.Exec(ctx, `INSERT INTO relay_workflow_signals (run_id, name, payload) VALUES ($1, 'approve', $2::jsonb)`, h.ID, deep); err != nil {
		t.Fatal(err)
	}
	b.start()
	b.waitFor("both bad signals set aside", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_signals WHERE run_id = $1 AND decode_error IS NOT NULL`, h.ID) == 2
	})
	if err := workflow.Signal(ctx, b.pool, h.ID, "approve", approval{By: "ann"}); err != nil {
		t.Fatal(err)
	}
	if out, err := result[string](t, b.pool, h.ID); err != nil || out != "ann" {
		t.Fatalf("run ended with %q, %v; want the good signal received", out, err)
	}
	var errs []string
	rows, err := b.pool.Query(ctx, `SELECT decode_error FROM relay_workflow_signals WHERE run_id = $1 AND consumed_by IS NULL ORDER BY id`, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var e string
		if err := rows.Scan(&e); err != nil {
			t.Fatal(err)
		}
		errs = append(errs, e)
	}
	if len(errs) != 2 || !strings.Contains(errs[0], "workflow_test.approval") || !strings.Contains(errs[1], "decode signal approve") {
		t.Fatalf("set-aside errors %q", errs)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND state = 'completed' AND output->>'by' = 'ann'`, h.ID); n != 1 {
		t.Fatal("the wait's checkpoint does not hold the good signal")
	}
}

// Signal refuses a payload over MaxSignalBytes or nested deeper than
// MaxSignalDepth, and sends nothing.
func TestSignalBounds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "waits-forever", func(wctx workflow.Context, _ int) (int, error) {
		_, _, err := workflow.WaitSignal[int](wctx, "x", 0)
		return 0, err
	})
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	err := workflow.Signal(ctx, b.pool, h.ID, "x", json.RawMessage(deepJSON(5000)))
	if !errors.Is(err, workflow.ErrTooDeep) || !strings.Contains(err.Error(), "nested 5000 deep") {
		t.Fatalf("deep payload: %v", err)
	}
	if err := workflow.Signal(ctx, b.pool, h.ID, "x", json.RawMessage(deepJSON(workflow.MaxSignalDepth))); err != nil {
		t.Fatalf("a payload at the depth limit: %v", err)
	}
	err = workflow.Signal(ctx, b.pool, h.ID, "x", strings.Repeat("a", workflow.MaxSignalBytes))
	if !errors.Is(err, workflow.ErrTooLarge) || !strings.Contains(err.Error(), "MaxSignalBytes") {
		t.Fatalf("large payload: %v", err)
	}
	// A string full of brackets is not nesting.
	if err := workflow.Signal(ctx, b.pool, h.ID, "x", strings.Repeat(`[{"\`, 1000)); err != nil {
		t.Fatalf("brackets inside a string: %v", err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_signals WHERE run_id = $1`, h.ID); n != 2 {
		t.Fatalf("%d signals sent, want the 2 within bounds", n)
	}
}
