package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// wfBundle is a bundle with a workflow registry executed by a client:
//   - "greet" completes: a step and a child run ("shout"), then returns;
//   - "pay" reserves (with a compensation), then charges, which fails for
//     good: the run is compensated;
//   - "report" fails while broken is set, with nothing to compensate;
//   - "approve" reserves (with a compensation) and waits for signal
//     "decision", returning its payload.
type wfBundle struct {
	*bundle
	broken atomic.Bool
	reg    *workflow.Registry
	greet  *workflow.Workflow[string, string]
	pay    *workflow.Workflow[int, string]
	report *workflow.Workflow[string, string]
	approv *workflow.Workflow[string, string]
}

func setupWorkflows(t *testing.T) *wfBundle {
	t.Helper()
	b := &wfBundle{bundle: setup(t)}
	b.broken.Store(true)
	b.reg = workflow.NewRegistry(b.pool, &workflow.Config{
		ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 }),
	})
	once := &workflow.StepOpts{MaxAttempts: 1}
	shout := workflow.MustRegister(b.reg, "shout", func(wctx workflow.Context, in string) (string, error) {
		return workflow.Step(wctx, "upper", func(context.Context) (string, error) { return strings.ToUpper(in), nil }, nil)
	})
	b.greet = workflow.MustRegister(b.reg, "greet", func(wctx workflow.Context, in string) (string, error) {
		hello, err := workflow.Step(wctx, "hello", func(context.Context) (string, error) { return "hello " + in, nil }, nil)
		if err != nil {
			return "", err
		}
		return workflow.Child(wctx, "shout", shout, hello, nil).Get(wctx)
	})
	b.pay = workflow.MustRegister(b.reg, "pay", func(wctx workflow.Context, amount int) (string, error) {
		if _, err := workflow.Step(wctx, "reserve", func(context.Context) (int, error) { return amount, nil }, nil); err != nil {
			return "", err
		}
		workflow.Compensate(wctx, "release", func(context.Context) error { return nil })
		return workflow.Step(wctx, "charge", func(context.Context) (string, error) {
			return "", errors.New("card declined")
		}, once)
	})
	b.report = workflow.MustRegister(b.reg, "report", func(wctx workflow.Context, in string) (string, error) {
		if _, err := workflow.Step(wctx, "gather", func(context.Context) (string, error) { return in, nil }, nil); err != nil {
			return "", err
		}
		return workflow.Step(wctx, "render", func(context.Context) (string, error) {
			if b.broken.Load() {
				return "", errors.New("renderer out of ink")
			}
			return "report of " + in, nil
		}, once)
	})
	b.approv = workflow.MustRegister(b.reg, "approve", func(wctx workflow.Context, in string) (string, error) {
		if _, err := workflow.Step(wctx, "reserve", func(context.Context) (string, error) { return in, nil }, nil); err != nil {
			return "", err
		}
		workflow.Compensate(wctx, "release", func(context.Context) error { return nil })
		d, ok, err := workflow.WaitSignal[map[string]string](wctx, "decision", 0)
		if err != nil || !ok {
			return "", err
		}
		return in + ": " + d["by"], nil
	})
	ws := core.NewWorkers()
	if err := b.reg.AddWorkers(ws); err != nil {
		t.Fatal(err)
	}
	c, err := core.NewClient(b.pool, &core.Config{Workers: ws, PollInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c.Stop(ctx) //nolint:errcheck // the test is over
	})
	return b
}

func start[In, Out any](b *wfBundle, wf *workflow.Workflow[In, Out], id string, in In) {
	b.t.Helper()
	if _, err := workflow.Start(b.ctx, b.pool, wf, in, &workflow.StartOpts{ID: id}); err != nil {
		b.t.Fatal(err)
	}
}

// runState polls the API for run id until it is in state.
func (b *wfBundle) waitRun(id, state string) map[string]any {
	b.t.Helper()
	var run map[string]any
	testdb.WaitFor(b.t, "run "+id+" to be "+state, func() bool {
		run = b.ok(b.do("GET", "/v1/workflows/runs/"+url.PathEscape(id), b.ro, nil))
		return run["state"] == state
	})
	return run
}

func steps(run map[string]any) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, s := range run["steps"].([]any) {
		m := s.(map[string]any)
		out[m["key"].(string)] = m
	}
	return out
}

// TestWorkflowRunsThroughAPI: a run that completes (with a child run), one
// that fails and compensates, one that fails and is retried from its
// failed step, one waiting for a signal that the API sends, one cancelled
// while waiting (its compensation runs) — read and changed through the
// API, each change audited.
func TestWorkflowRunsThroughAPI(t *testing.T) {
	t.Parallel()
	b := setupWorkflows(t)
	start(b, b.greet, "greet-1", "ada")
	start(b, b.pay, "pay-1", 42)
	start(b, b.report, "report-1", "q3")
	start(b, b.approv, "approve-1", "po-7")
	start(b, b.approv, "approve-2", "po-8")

	// Completed, with its step and its child linked both ways.
	run := b.waitRun("greet-1", "completed")
	if string(jsonOf(t, run["output"])) != `"HELLO ADA"` || run["input"] != "ada" || run["duration_ms"] == nil {
		t.Fatalf("completed run: %v", run)
	}
	st := steps(run)
	if st["hello"]["state"] != "completed" || st["hello"]["output_bytes"].(float64) != float64(len(`"hello ada"`)) ||
		st["hello"]["attempts"].(float64) != 1 || st["shout"]["kind"] != "child" || st["shout"]["child_id"] != "greet-1/shout" {
		t.Fatalf("steps: %v", run["steps"])
	}
	if log := st["hello"]["attempt_log"].([]any); len(log) != 1 || log[0].(map[string]any)["attempt"].(float64) != 1 ||
		log[0].(map[string]any)["started_at"] == nil || log[0].(map[string]any)["error"] != nil {
		t.Fatalf("attempt log: %v", st["hello"]["attempt_log"])
	}
	kids := run["children"].([]any)
	if len(kids) != 1 || kids[0].(map[string]any)["id"] != "greet-1/shout" || kids[0].(map[string]any)["state"] != "completed" {
		t.Fatalf("children: %v", kids)
	}
	child := b.ok(b.do("GET", "/v1/workflows/runs/"+url.PathEscape("greet-1/shout"), b.ro, nil))
	if child["parent_id"] != "greet-1" || child["workflow"] != "shout" {
		t.Fatalf("child run by its escaped id: %v", child)
	}

	// Failed and compensated: the failed step's error, the compensation
	// step marked. A compensated run cannot be retried.
	run = b.waitRun("pay-1", "compensated")
	st = steps(run)
	if st["charge"]["state"] != "failed" || !strings.Contains(st["charge"]["error"].(string), "card declined") ||
		st["compensate:release"]["compensation"] != true || st["compensate:release"]["state"] != "completed" ||
		st["reserve"]["compensation"] != false {
		t.Fatalf("compensated run's steps: %v", run["steps"])
	}
	p := b.problem(b.do("POST", "/v1/workflows/runs/pay-1/retry", b.rw, nil), 409)
	if !strings.Contains(p["detail"].(string), "not failed") {
		t.Fatalf("retry of a compensated run: %v", p)
	}

	// Failed: retried from its failed step once fixed; the step before is
	// not run again.
	run = b.waitRun("report-1", "failed")
	if !strings.Contains(run["error"].(string), "out of ink") {
		t.Fatalf("failed run: %v", run)
	}
	gathered := steps(run)["gather"]["finished_at"]
	b.problem(b.do("POST", "/v1/workflows/runs/report-1/retry", b.ro, nil), 403)
	b.broken.Store(false)
	res := b.ok(b.do("POST", "/v1/workflows/runs/report-1/retry", b.rw, nil))
	if res["action"] != "retry" || res["state"] != "pending" {
		t.Fatalf("retry answered %v", res)
	}
	run = b.waitRun("report-1", "completed")
	if st := steps(run); st["gather"]["finished_at"] != gathered || st["render"]["state"] != "completed" {
		t.Fatalf("after the retry: %v", run["steps"])
	}

	// Waiting for a signal: the API sends it, the run completes with it.
	testdb.WaitFor(t, "approve-1 to wait", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'approve-1' AND kind = 'signal' AND state = 'waiting'`) == 1
	})
	run = b.ok(b.do("GET", "/v1/workflows/runs/approve-1", b.ro, nil))
	if w := steps(run)["signal:decision#1"]; w["state"] != "waiting" || w["kind"] != "signal" {
		t.Fatalf("waiting run's steps: %v", run["steps"])
	}
	b.problem(b.do("POST", "/v1/workflows/runs/approve-1/signal", b.rw, `{"payload":{"by":"eve"}}`), 422)
	b.problem(b.do("POST", "/v1/workflows/runs/approve-1/signal", b.rw, `{"name":"decision","extra":1}`), 422)
	b.problem(b.do("POST", "/v1/workflows/runs/approve-1/signal", b.rw, `{"name":"decision","payload":`), 400)
	b.problem(b.do("POST", "/v1/workflows/runs/approve-1/signal", b.ro, `{"name":"decision","payload":{"by":"eve"}}`), 403)
	b.ok(b.do("POST", "/v1/workflows/runs/approve-1/signal", b.rw, `{"name":"decision","payload":{"by":"eve"}}`))
	run = b.waitRun("approve-1", "completed")
	if string(jsonOf(t, run["output"])) != `"po-7: eve"` {
		t.Fatalf("signalled run's output: %v", run["output"])
	}
	b.problem(b.do("POST", "/v1/workflows/runs/approve-1/signal", b.rw, `{"name":"decision"}`), 409)
	b.problem(b.do("POST", "/v1/workflows/runs/approve-1/cancel", b.rw, nil), 409)

	// Cancelled while waiting: its compensation runs.
	testdb.WaitFor(t, "approve-2 to wait", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'approve-2' AND kind = 'signal'`) == 1
	})
	b.ok(b.do("POST", "/v1/workflows/runs/approve-2/cancel", b.rw, nil))
	run = b.waitRun("approve-2", "cancelled")
	if steps(run)["compensate:release"]["state"] != "completed" {
		t.Fatalf("cancelled run's steps: %v", run["steps"])
	}

	// Unknown runs.
	b.problem(b.do("GET", "/v1/workflows/runs/nope", b.ro, nil), 404)
	for _, a := range []string{"cancel", "retry"} {
		b.problem(b.do("POST", "/v1/workflows/runs/nope/"+a, b.rw, nil), 404)
	}
	b.problem(b.do("POST", "/v1/workflows/runs/nope/signal", b.rw, `{"name":"x"}`), 404)

	// Every accepted change is audited, and only those.
	rows, err := b.pool.Query(b.ctx, `SELECT action || ' ' || (target->'ids'->>0) || ' ' || subject FROM relay_admin_audit ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	want := "workflows.retry report-1 alice@example.com|workflows.signal approve-1 alice@example.com|workflows.cancel approve-2 alice@example.com"
	if strings.Join(got, "|") != want {
		t.Fatalf("audit %q, want %q", strings.Join(got, "|"), want)
	}

	// Lists: by workflow, by state, by time; keyset pages.
	list := func(q string) []string {
		t.Helper()
		page := b.ok(b.do("GET", "/v1/workflows/runs"+q, b.ro, nil))
		var ids []string
		for _, it := range page["items"].([]any) {
			ids = append(ids, it.(map[string]any)["id"].(string))
		}
		return ids
	}
	if got := list("?workflow=approve"); strings.Join(got, ",") != "approve-2,approve-1" {
		t.Fatalf("approve runs: %v", got)
	}
	if got := list("?state=compensated"); strings.Join(got, ",") != "pay-1" {
		t.Fatalf("compensated runs: %v", got)
	}
	if got := list("?created_after=" + url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339))); len(got) != 0 {
		t.Fatalf("runs created in the future: %v", got)
	}
	all := list("")
	var paged []string
	cur := ""
	for range 10 {
		page := b.ok(b.do("GET", "/v1/workflows/runs?limit=2&cursor="+cur, b.ro, nil))
		for _, it := range page["items"].([]any) {
			paged = append(paged, it.(map[string]any)["id"].(string))
		}
		next, _ := page["next_cursor"].(string)
		if next == "" {
			break
		}
		cur = url.QueryEscape(next)
	}
	if len(all) != 6 || strings.Join(paged, ",") != strings.Join(all, ",") {
		t.Fatalf("pages of 2 %v, one page %v", paged, all)
	}
	stats := b.ok(b.do("GET", "/v1/workflows/stats", b.ro, nil))
	if stats["failed"].(float64) != 0 || stats["cap"].(float64) != statsCap {
		t.Fatalf("stats %v", stats)
	}
}

// TestWorkflowRefusals: bad input to the workflow endpoints is a 4xx
// problem, never a 500, and changes nothing.
func TestWorkflowRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, c := range []struct {
		method, path, body string
		status             int
	}{
		{"GET", "/v1/workflows/runs?state=" + url.QueryEscape("failed' OR 1=1 --"), "", 422},
		{"GET", "/v1/workflows/runs?limit=501", "", 422},
		{"GET", "/v1/workflows/runs?limit=0", "", 422},
		{"GET", "/v1/workflows/runs?created_after=2026-01-02T00:00:00Z&created_before=2026-01-01T00:00:00Z", "", 422},
		{"GET", "/v1/workflows/runs?created_after=yesterday", "", 422},
		{"GET", "/v1/workflows/runs?cursor=" + b64(`{"k":"audit","i":5}`), "", 422},
		{"GET", "/v1/workflows/runs?cursor=" + b64(`{"k":"workflow-runs","t":"2026-01-01T00:00:00Z","i":""}`), "", 422},
		{"GET", "/v1/workflows/runs?cursor=%27%3B--", "", 422},
		{"GET", "/v1/workflows/runs?workflow=a%00b", "", 400},
		{"GET", "/v1/workflows/runs?colour=red", "", 422},
		{"GET", "/v1/workflows/runs/" + strings.Repeat("x", 256), "", 422},
		{"GET", "/v1/workflows/runs/%27%3B%20DROP%20TABLE%20relay_workflow_runs", "", 404},
		{"POST", "/v1/workflows/runs/x/signal", `{}`, 422},
		{"POST", "/v1/workflows/runs/x/signal", `{"name":""}`, 422},
		{"POST", "/v1/workflows/runs/x/signal", `{"name":"` + strings.Repeat("n", 201) + `"}`, 422},
		{"POST", "/v1/workflows/runs/x/signal", `{"name":"a\u0000b"}`, 422},
		{"POST", "/v1/workflows/runs/x/signal", `[]`, 422},
		{"POST", "/v1/workflows/runs/x/signal", `{"name":"n","payload":"` + strings.Repeat("p", 70<<10) + `"}`, 413},
		// Any JSON payload passes validation (the run is unknown: 404).
		{"POST", "/v1/workflows/runs/x/signal", `{"name":"n","payload":"text"}`, 404},
		{"POST", "/v1/workflows/runs/x/signal", `{"name":"n","payload":[1,{"a":null}]}`, 404},
		{"POST", "/v1/workflows/runs/x/signal", `{"name":"n","payload":3.5}`, 404},
		{"POST", "/v1/workflows/runs/x/signal", `{"name":"n","payload":null}`, 404},
		{"POST", "/v1/workflows/runs/x/retry", "", 404},
		{"PUT", "/v1/workflows/runs/x/retry", "", 405},
	} {
		r := b.do(c.method, c.path, b.rw, c.body)
		b.problem(r, c.status)
	}
	if n := b.count(`SELECT count(*) FROM relay_admin_audit`); n != 0 {
		t.Fatalf("%d audit rows after refused changes", n)
	}
}

// TestWorkflowRunListUsesIndex: the first page of the runs of one state,
// and of every run, is read from an index and stops at the page, with
// 200,000 completed runs and a few failed ones.
func TestWorkflowRunListUsesIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(`ALTER TABLE relay_workflow_runs DISABLE TRIGGER USER`)
	b.exec(`INSERT INTO relay_workflow_runs (id, workflow, state, input, queue, created_at, finished_at, error, tags)
		SELECT 'run-' || g, 'wf-' || (g % 5), CASE WHEN g % 1000 = 0 THEN 'failed' ELSE 'completed' END, '{}', 'default',
		       now() - g * interval '1 second', now() - g * interval '1 second' + interval '1 s',
		       CASE WHEN g % 1000 = 0 THEN 'boom' END,
		       CASE WHEN g % 10000 = 0 THEN ARRAY['order:' || g, 'tenant:acme'] ELSE '{}' END
		FROM generate_series(1, 200000) AS g`)
	b.exec(`ALTER TABLE relay_workflow_runs ENABLE TRIGGER USER`)
	b.exec(`ANALYZE relay_workflow_runs`)
	for _, c := range []struct {
		f     runFilter
		index string
	}{
		{runFilter{State: "failed"}, "relay_workflow_runs_error_idx"},
		{runFilter{State: "failed", Workflow: "wf-0"}, "relay_workflow_runs_error_idx"},
		{runFilter{State: "pending"}, "relay_workflow_runs_unfinished_idx"},
		{runFilter{}, "relay_workflow_runs_list_idx"},
		{runFilter{Workflow: "wf-3"}, "relay_workflow_runs_list_idx"},
	} {
		sql, args := sqlListRuns(c.f, nil, defaultLimit+1)
		plan := explain(t, b.pool, sql, args...)
		if !strings.Contains(plan, c.index) || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Sort") {
			t.Fatalf("first page of %+v does not walk %s:\n%s", c.f, c.index, plan)
		}
		t.Logf("%+v:\n%s", c.f, plan)
	}
	// A tag filter reads the tags index (a few rows, then sorted).
	for _, f := range []runFilter{{Tags: []string{"order:50000"}}, {Tags: []string{"tenant:acme", "order:50000"}, Workflow: "wf-0"}} {
		sql, args := sqlListRuns(f, nil, defaultLimit+1)
		if plan := explain(t, b.pool, sql, args...); !strings.Contains(plan, "relay_workflow_runs_tags_idx") || strings.Contains(plan, "Seq Scan") {
			t.Fatalf("runs of tags %q do not read relay_workflow_runs_tags_idx:\n%s", f.Tags, plan)
		}
	}
	page := b.ok(b.do("GET", "/v1/workflows/runs?state=failed&limit=50", b.ro, nil))
	c, err := decodeRunCursor(page["next_cursor"].(string))
	if err != nil {
		t.Fatal(err)
	}
	sql, args := sqlListRuns(runFilter{State: "failed"}, c, defaultLimit+1)
	if plan := explain(t, b.pool, sql, args...); !strings.Contains(plan, "relay_workflow_runs_error_idx") || strings.Contains(plan, "Sort") {
		t.Fatalf("second page:\n%s", plan)
	}
	for _, state := range []string{"failed", "pending"} {
		sql, args := sqlCountRunsOfState(state)
		if plan := explain(t, b.pool, sql, append(args, statsCap)...); strings.Contains(plan, "Seq Scan") {
			t.Fatalf("%s runs count:\n%s", state, plan)
		}
	}
}

func jsonOf(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A signal the run cannot decode is set aside, and the run's page lists
// it with its decoding error; the run goes on waiting and completes with
// the next good signal. Signal's bounds are a 422.
func TestWorkflowSetAsideSignal(t *testing.T) {
	t.Parallel()
	b := setupWorkflows(t)
	start(b, b.approv, "approve-bad", "po-9")
	b.ok(b.do("POST", "/v1/workflows/runs/approve-bad/signal", b.rw, `{"name":"decision","payload":[1,2]}`))
	var run map[string]any
	testdb.WaitFor(t, "the bad signal set aside", func() bool {
		run = b.ok(b.do("GET", "/v1/workflows/runs/approve-bad", b.ro, nil))
		// The run and its signals are two reads: the run may be read
		// just before the write that set the signal aside.
		return len(run["set_aside_signals"].([]any)) == 1 && run["state"] == "running"
	})
	sg := run["set_aside_signals"].([]any)[0].(map[string]any)
	if sg["name"] != "decision" || !strings.Contains(sg["decode_error"].(string), "map[string]string") ||
		string(jsonOf(t, sg["payload"])) != `[1,2]` || sg["set_aside_at"] == nil {
		t.Fatalf("set-aside signal: %v", sg)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'approve-bad' AND finished_at IS NULL`); n != 1 {
		t.Fatal("the run ended on a bad signal")
	}
	deep := strings.Repeat("[", 100) + strings.Repeat("]", 100)
	p := b.problem(b.do("POST", "/v1/workflows/runs/approve-bad/signal", b.rw, `{"name":"decision","payload":`+deep+`}`), 422)
	if !strings.Contains(fmt.Sprint(p["detail"]), "nested") {
		t.Fatalf("deep payload problem: %v", p)
	}
	b.ok(b.do("POST", "/v1/workflows/runs/approve-bad/signal", b.rw, `{"name":"decision","payload":{"by":"eve"}}`))
	run = b.waitRun("approve-bad", "completed")
	if string(jsonOf(t, run["output"])) != `"po-9: eve"` || len(run["set_aside_signals"].([]any)) != 1 {
		t.Fatalf("after the good signal: %v, %v", run["output"], run["set_aside_signals"])
	}
}
