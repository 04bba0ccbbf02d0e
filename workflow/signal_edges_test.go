package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/workflow"
)

// A signal of exactly MaxSignalBytes and one nested exactly MaxSignalDepth
// deep are sent and received whole; one byte or one level more is refused
// and sends nothing.
func TestSignalAtItsBounds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "bounded", func(wctx workflow.Context, _ int) ([]int, error) {
		s, _, err := workflow.WaitSignal[string](wctx, "big", 0)
		if err != nil {
			return nil, err
		}
		d, _, err := workflow.WaitSignal[json.RawMessage](wctx, "deep", 0)
		if err != nil {
			return nil, err
		}
		return []int{len(s), len(d)}, nil
	})
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	exact := strings.Repeat("a", workflow.MaxSignalBytes-2) // its JSON is the two quotes more
	if err := workflow.Signal(ctx, b.pool, h.ID, "big", exact+"a"); !errors.Is(err, workflow.ErrTooLarge) {
		t.Fatalf("one byte over MaxSignalBytes: %v", err)
	}
	if err := workflow.Signal(ctx, b.pool, h.ID, "deep", json.RawMessage(deepJSON(workflow.MaxSignalDepth+1))); !errors.Is(err, workflow.ErrTooDeep) {
		t.Fatalf("one level over MaxSignalDepth: %v", err)
	}
	if err := workflow.Signal(ctx, b.pool, h.ID, "big", exact); err != nil {
		t.Fatalf("exactly MaxSignalBytes: %v", err)
	}
	deep := deepJSON(workflow.MaxSignalDepth)
	if err := workflow.Signal(ctx, b.pool, h.ID, "deep", json.RawMessage(deep)); err != nil {
		t.Fatalf("exactly MaxSignalDepth: %v", err)
	}
	b.start()
	got, err := result[[]int](t, b.pool, h.ID)
	if err != nil || len(got) != 2 || got[0] != len(exact) || got[1] != len(deep) {
		t.Fatalf("received %v, %v; want [%d %d]", got, err, len(exact), len(deep))
	}
}

// A signal sent in the transaction that starts the run, before anything
// executes it, is the first wait's; a signal whose transaction rolls back
// is not there; a second signal of one name waits for the second wait.
func TestSignalBeforeTheRunStarts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "early", func(wctx workflow.Context, _ int) (int, error) {
		first, _, err := workflow.WaitSignal[int](wctx, "n", 0)
		if err != nil {
			return 0, err
		}
		second, _, err := workflow.WaitSignal[int](wctx, "n", 0)
		return first*10 + second, err
	})
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := workflow.Start(ctx, tx, wf, 0, &workflow.StartOpts{ID: "early"}); err != nil {
			return err
		}
		return workflow.Signal(ctx, tx, "early", "n", 1)
	})
	if err != nil {
		t.Fatal(err)
	}
	rolledBack := errors.New("rolled back")
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if err := workflow.Signal(ctx, tx, "early", "n", 9); err != nil {
			return err
		}
		return rolledBack
	})
	if !errors.Is(err, rolledBack) {
		t.Fatal(err)
	}
	if err := workflow.Signal(ctx, b.pool, "early", "n", 2); err != nil {
		t.Fatal(err)
	}
	b.start()
	if out, err := result[int](t, b.pool, "early"); err != nil || out != 12 {
		t.Fatalf("the run ended %d, %v; want 12 (the signals in order, none rolled back)", out, err)
	}
	if err := workflow.Signal(ctx, b.pool, "early", "n", 3); !errors.Is(err, workflow.ErrRunFinished) || !strings.Contains(err.Error(), "completed") {
		t.Fatalf("signal to the finished run: %v", err)
	}
	if err := workflow.Signal(ctx, b.pool, "never-started", "n", 3); !errors.Is(err, workflow.ErrRunNotFound) {
		t.Fatalf("signal to no run: %v", err)
	}
}
