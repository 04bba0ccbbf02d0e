package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/workflow"
)

// A process that registered nothing starts a run by its workflow's name,
// with a JSON input, and reads its output as JSON (or decoded); the
// workers' process executes it. Bad names and inputs are refused before
// anything is written.
func TestStartByName(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type order struct {
		ID    string `json:"id"`
		Cents int    `json:"cents"`
	}
	workflow.MustRegister(b.reg, "invoice", func(wctx workflow.Context, o order) (map[string]any, error) {
		if o.Cents < 0 {
			return nil, errors.New("negative amount")
		}
		return map[string]any{"order": o.ID, "total": o.Cents + 100}, nil
	})
	b.start()

	h, err := workflow.StartByName(ctx, b.pool, "invoice", map[string]any{"id": "o-1", "cents": 900}, &workflow.StartOpts{ID: "inv-1"})
	if err != nil {
		t.Fatal(err)
	}
	if h.ID != "inv-1" || h.Workflow != "invoice" || h.Existing {
		t.Fatalf("handle %+v", h)
	}
	raw, err := h.Result(ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Order string `json:"order"`
		Total int    `json:"total"`
	}
	if err := json.Unmarshal(raw, &got); err != nil || got.Order != "o-1" || got.Total != 1000 {
		t.Fatalf("output %s (%v)", raw, err)
	}
	again, err := workflow.StartByName(ctx, b.pool, "invoice", json.RawMessage(`{"id":"o-1","cents":900}`), &workflow.StartOpts{ID: "inv-1"})
	if err != nil || !again.Existing {
		t.Fatalf("second start of inv-1: %+v, %v", again, err)
	}
	got.Total = 0
	if err := again.ResultInto(ctx, b.pool, &got); err != nil || got.Total != 1000 {
		t.Fatalf("ResultInto: %+v, %v", got, err)
	}
	bad, err := workflow.StartByName(ctx, b.pool, "invoice", json.RawMessage(`{"id":"o-2","cents":-1}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Result(ctx, b.pool); !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), "negative amount") {
		t.Fatalf("failed run's result: %v", err)
	}
	// Another workflow's id is refused as Start refuses it.
	if _, err := workflow.StartByName(ctx, b.pool, "other", nil, &workflow.StartOpts{ID: "inv-1"}); !errors.Is(err, workflow.ErrIDInUse) {
		t.Errorf("start of another workflow under inv-1: %v", err)
	}
	before := b.count(`SELECT count(*) FROM relay_workflow_runs`)
	for _, c := range []struct {
		name  string
		input any
		want  string
	}{
		{"", nil, "must be 1 to 255 bytes"},
		{strings.Repeat("n", 256), nil, "must be 1 to 255 bytes"},
		{"invoice", json.RawMessage(`{"id":`), "not valid JSON"},
		{"invoice", make(chan int), "encode input"},
		{"invoice", json.RawMessage(`"` + strings.Repeat("x", workflow.MaxPayloadBytes) + `"`), "too large"},
	} {
		if _, err := workflow.StartByName(ctx, b.pool, c.name, c.input, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("StartByName(%.20q): %v, want %q", c.name, err, c.want)
		}
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs`); n != before {
		t.Errorf("%d runs written by refused starts", n-before)
	}
}
