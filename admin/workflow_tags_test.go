package admin

import (
	"net/url"
	"strings"
	"testing"

	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// TestWorkflowRunsByTag: GET /v1/workflows/runs?tag= lists the runs
// carrying every tag given, each run shows its tags, and a bad tag is a
// 422 naming the parameter.
func TestWorkflowRunsByTag(t *testing.T) {
	t.Parallel()
	b := setupWorkflows(t)
	for _, r := range []struct {
		id   string
		tags []string
	}{
		{"g-1", []string{"tenant:acme", "order:1"}},
		{"g-2", []string{"tenant:acme", "order:2"}},
		{"g-3", []string{"tenant:globex", "order:3, with a comma"}},
		{"g-4", nil},
	} {
		if _, err := workflow.Start(b.ctx, b.pool, b.greet, "x", &workflow.StartOpts{ID: r.id, Tags: r.tags}); err != nil {
			t.Fatal(err)
		}
	}
	list := func(q string) string {
		t.Helper()
		page := b.ok(b.do("GET", "/v1/workflows/runs"+q, b.ro, nil))
		var ids []string
		for _, it := range page["items"].([]any) {
			m := it.(map[string]any)
			if m["parent_id"] == nil {
				ids = append(ids, m["id"].(string))
			}
		}
		return strings.Join(ids, ",")
	}
	for q, want := range map[string]string{
		"?tag=tenant:acme":                                 "g-2,g-1",
		"?tag=tenant:acme&tag=order:1":                     "g-1",
		"?tag=" + url.QueryEscape("order:3, with a comma"): "g-3",
		"?tag=tenant:acme&tag=tenant:globex":               "",
		"?tag=tenant:acme&workflow=greet&tag=" + "order:2": "g-2",
		"?tag=nobody": "",
	} {
		if got := list(q); got != want {
			t.Errorf("runs %s: %q, want %q", q, got, want)
		}
	}
	run := b.ok(b.do("GET", "/v1/workflows/runs/g-1", b.ro, nil))
	if tags, _ := run["tags"].([]any); len(tags) != 2 || tags[0] != "tenant:acme" || tags[1] != "order:1" {
		t.Errorf("run's tags: %v", run["tags"])
	}
	if run := b.ok(b.do("GET", "/v1/workflows/runs/g-4", b.ro, nil)); run["tags"] == nil {
		t.Errorf("an untagged run's tags: %v, want []", run["tags"])
	}
	b.problem(b.do("GET", "/v1/workflows/runs?tag=%00", b.ro, nil), 400) // refused before the handler, as every NUL
	for _, q := range []string{"?tag=", "?tag=a&tag=", "?tag=" + strings.Repeat("x", workflow.MaxTagBytes+1)} {
		p := b.problem(b.do("GET", "/v1/workflows/runs"+q, b.ro, nil), 422)
		if !strings.Contains(fmtProblem(p), "query.tag") {
			t.Errorf("runs %s: %v, want a problem naming query.tag", q[:min(len(q), 20)], p)
		}
	}
}

func fmtProblem(p map[string]any) string {
	var b strings.Builder
	for _, e := range p["errors"].([]any) {
		b.WriteString(e.(map[string]any)["location"].(string) + " ")
	}
	return b.String()
}

// TestWorkflowRunUpdates: a run's page lists its update requests, newest
// first, with their state.
func TestWorkflowRunUpdates(t *testing.T) {
	t.Parallel()
	b := setupWorkflows(t)
	start(b, b.approv, "approve-u", "po-9")
	testdb.WaitFor(t, "approve-u to wait", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'approve-u' AND kind = 'signal'`) == 1
	})
	if _, err := workflow.SendUpdate(b.ctx, b.pool, "approve-u", "rename", map[string]string{"to": "po-10"}); err != nil {
		t.Fatal(err)
	}
	run := b.ok(b.do("GET", "/v1/workflows/runs/approve-u", b.ro, nil))
	ups, _ := run["updates"].([]any)
	if len(ups) != 1 || ups[0].(map[string]any)["name"] != "rename" || ups[0].(map[string]any)["state"] != "pending" {
		t.Fatalf("updates: %v", run["updates"])
	}
}
