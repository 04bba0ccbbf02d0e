package admin

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/relayq/relay/workflow"
)

// A run's history through the API is the library's export: it decodes,
// names the run and its steps (the compensation included), and replays on
// the registry that ran it. A run that does not exist is 404, a request
// without a token 401.
func TestWorkflowRunHistoryThroughAPI(t *testing.T) {
	b := setupWorkflows(t)
	start(b, b.pay, "pay-1", 5)
	b.waitRun("pay-1", "compensated")
	r := b.do("GET", "/v1/workflows/runs/pay-1/history", b.ro, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	hs, err := workflow.DecodeHistories(bytes.NewReader(r.Body))
	if err != nil {
		t.Fatalf("decode %s: %v", r.Body, err)
	}
	h := hs[0]
	if h.Format != workflow.HistoryFormat || h.Run.ID != "pay-1" || h.Run.Workflow != "pay" || h.Run.State != workflow.StateCompensated {
		t.Fatalf("history run: %+v", h.Run)
	}
	var keys []string
	for _, s := range h.Steps {
		keys = append(keys, s.Key)
	}
	if len(keys) != 3 || keys[0] != "reserve" || keys[1] != "charge" || keys[2] != "compensate:release" || h.Steps[1].State != "failed" {
		t.Fatalf("steps %v (charge %s)", keys, h.Steps[1].State)
	}
	if err := workflow.Replay(b.ctx, b.reg, h); err != nil {
		t.Fatalf("replay on the registry that ran it: %v", err)
	}
	b.problem(b.do("GET", "/v1/workflows/runs/nope/history", b.ro, nil), http.StatusNotFound)
	b.problem(b.do("GET", "/v1/workflows/runs/pay-1/history", "", nil), http.StatusUnauthorized)
}
