package admin

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/workflow"
)

// TestUndecodableOutboxRowsShowInTheAPI: an event the dispatcher set aside
// (stored headers of another shape) is listed as failed with its decode
// error, apart from the dispatched ones, and can be redispatched once
// fixed; a stored subscription the dispatchers cannot use says why.
func TestUndecodableOutboxRowsShowInTheAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d, err := outbox.NewDispatcher(b.pool, &outbox.Config{Subscriptions: []outbox.Subscription{
		{Topic: "order.paid", Kind: "receipt"}, {Topic: "order.paid", Kind: "ledger"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	good, err := outbox.Publish(b.ctx, b.pool, outbox.Event{Topic: "order.paid", Payload: 1})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := outbox.Publish(b.ctx, b.pool, outbox.Event{Topic: "order.paid", Payload: 2})
	if err != nil {
		t.Fatal(err)
	}
	b.exec(`UPDATE relay_outbox SET headers = '{"x": 1}' WHERE id = $1`, bad)
	forever, err := outbox.Publish(b.ctx, b.pool, outbox.Event{Topic: "order.paid", Payload: 3})
	if err != nil {
		t.Fatal(err)
	}
	b.exec(`UPDATE relay_outbox SET published_at = 'infinity' WHERE id = $1`, forever)
	if err := d.Declare(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.exec(`UPDATE relay_outbox_subscriptions SET metadata = '"text"' WHERE kind = 'ledger'`)
	if n, err := d.DispatchOnce(b.ctx); err != nil || n != 3 {
		t.Fatalf("DispatchOnce = %d, %v; want 3", n, err)
	}

	failed := b.ok(b.do("GET", "/v1/outbox/events?state=failed", b.ro, nil))["items"].([]any)
	if len(failed) != 2 || failed[0].(map[string]any)["id"].(float64) != float64(forever) ||
		!strings.Contains(failed[0].(map[string]any)["dispatch_error"].(string), "published_at") {
		t.Fatalf("failed events: %s", mustJSON(failed))
	}
	f := failed[1].(map[string]any)
	if f["id"].(float64) != float64(bad) || f["state"] != "failed" || f["failed_at"] == nil ||
		!strings.Contains(f["dispatch_error"].(string), "decode headers") {
		t.Fatalf("failed event: %s", mustJSON(f))
	}
	done := b.ok(b.do("GET", "/v1/outbox/events?state=dispatched", b.ro, nil))["items"].([]any)
	if len(done) != 1 || done[0].(map[string]any)["id"].(float64) != float64(good) || done[0].(map[string]any)["dispatch_error"] != nil {
		t.Fatalf("dispatched events: %s", mustJSON(done))
	}
	for _, s := range b.ok(b.do("GET", "/v1/outbox/subscriptions", b.ro, nil))["items"].([]any) {
		s := s.(map[string]any)
		if msg, _ := s["error"].(string); (s["kind"] == "ledger") != strings.Contains(msg, "decode metadata") {
			t.Errorf("subscription: %s", mustJSON(s))
		}
	}

	// Fixed behind the API, then redispatched: it goes out like any other.
	b.exec(`UPDATE relay_outbox SET headers = '{"x": "1"}' WHERE id = $1`, bad)
	b.ok(b.do("POST", "/v1/outbox/events/"+itoa(bad)+"/redispatch", b.rw, nil))
	if n, err := d.DispatchOnce(b.ctx); err != nil || n != 1 {
		t.Fatalf("DispatchOnce after the fix = %d, %v; want 1", n, err)
	}
	if n := b.count(`SELECT count(*) FROM relay_outbox WHERE failed_at IS NULL AND dispatch_error IS NULL AND jobs = 2`); n != 2 {
		t.Fatalf("%d events dispatched clean with 2 jobs; want 2", n)
	}
}

// TestUndecodableRunInputShowsInTheAPI: a run whose stored input does not
// decode into its workflow's input type (written behind Start) is failed
// alone, and the API shows the decode error on the run; a run started
// beside it completes. A step's stored attempt log of another shape is
// reported on that step, and the run's page still reads.
func TestUndecodableRunInputShowsInTheAPI(t *testing.T) {
	t.Parallel()
	b := setupWorkflows(t)
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := workflow.Start(b.ctx, tx, b.greet, "ada", &workflow.StartOpts{ID: "bad-input"}); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, `UPDATE relay_workflow_runs SET input = '{"x": 1}' WHERE id = 'bad-input'`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	start(b, b.greet, "good", "bob")
	run := b.waitRun("bad-input", "failed")
	if msg, _ := run["error"].(string); !strings.Contains(msg, "decode input") || !strings.Contains(msg, "bad-input") {
		t.Fatalf("run: %s", mustJSON(run))
	}
	b.waitRun("good", "completed")

	// A step's stored attempt log of another shape costs that step its log,
	// not the run its page.
	b.exec(`UPDATE relay_workflow_steps SET attempt_log = '{"x": 1}' WHERE run_id = 'good' AND key = 'hello'`)
	run = b.waitRun("good", "completed")
	st := steps(run)
	if msg, _ := st["hello"]["attempt_log_error"].(string); !strings.Contains(msg, "decode attempt log") || len(st["hello"]["attempt_log"].([]any)) != 0 {
		t.Fatalf("step with a bad attempt log: %s", mustJSON(st["hello"]))
	}
}
