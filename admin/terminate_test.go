package admin

import (
	"strings"
	"testing"

	"github.com/relayq/relay/testkit/testdb"
)

// A run waiting for a signal is terminated through the API: it ends
// terminated with the reason as its error, its compensation never runs,
// the change is audited with its reason, and a second terminate is 409. A
// read-only token, a missing or bad reason and an unknown run are refused.
func TestTerminateThroughAPI(t *testing.T) {
	t.Parallel()
	b := setupWorkflows(t)
	start(b, b.approv, "approve-t", "po-9")
	testdb.WaitFor(t, "approve-t to wait", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'approve-t' AND kind = 'signal' AND state = 'waiting'`) == 1
	})
	const path = "/v1/workflows/runs/approve-t/terminate"
	b.problem(b.do("POST", path, b.ro, `{"reason":"stuck"}`), 403)
	b.problem(b.do("POST", path, b.rw, `{}`), 422)
	b.problem(b.do("POST", path, b.rw, `{"reason":""}`), 422)
	b.problem(b.do("POST", path, b.rw, `{"reason":"`+strings.Repeat("x", 1025)+`"}`), 422)
	b.problem(b.do("POST", path, b.rw, `{"reason":"nul\u0000"}`), 422)
	b.problem(b.do("POST", "/v1/workflows/runs/nope/terminate", b.rw, `{"reason":"stuck"}`), 404)
	res := b.ok(b.do("POST", path, b.rw, `{"reason":"stuck behind a bad deploy"}`))
	if res["action"] != "terminate" || res["state"] != "terminated" {
		t.Fatalf("terminate answered %v", res)
	}
	run := b.waitRun("approve-t", "terminated")
	if !strings.Contains(run["error"].(string), "stuck behind a bad deploy") {
		t.Fatalf("terminated run: %v", run)
	}
	if _, ok := steps(run)["compensate:release"]; ok {
		t.Fatalf("a compensation ran: %v", run["steps"])
	}
	b.problem(b.do("POST", path, b.rw, `{"reason":"again"}`), 409)
	if n := b.count(`SELECT count(*) FROM relay_admin_audit WHERE action = 'workflows.terminate'
		AND target->'ids'->>0 = 'approve-t' AND target->>'reason' = 'stuck behind a bad deploy' AND subject = 'alice@example.com'`); n != 1 {
		t.Fatalf("%d audit rows for the terminate, want 1", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_admin_audit WHERE action = 'workflows.terminate'`); n != 1 {
		t.Fatalf("%d terminate audit rows, want 1 (refused ones are not audited)", n)
	}
	page := b.ok(b.do("GET", "/v1/workflows/runs?state=terminated", b.ro, nil))
	if items := page["items"].([]any); len(items) != 1 || items[0].(map[string]any)["id"] != "approve-t" {
		t.Fatalf("runs listed terminated: %v", page["items"])
	}
}
