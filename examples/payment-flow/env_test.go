package main

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
	"github.com/relayq/relay/workflowtest"
)

// flowEnv is the payment flow registered in a test environment (virtual
// time, a database of the test's own), its provider on loopback.
func flowEnv(t *testing.T) (*workflowtest.Env, *workflow.Workflow[Order, Receipt], *Provider) {
	t.Helper()
	env := workflowtest.New(t, testdb.URL(t), &workflowtest.Config{Queues: map[string]int{"payments": 4, "email": 2}})
	if _, err := env.Pool().Exec(context.Background(), schema); err != nil {
		t.Fatal(err)
	}
	provider := NewProvider()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: provider, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	payment, err := register(env.Registry(), env.Pool(), "http://"+ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return env, payment, provider
}

// The confirmed order completes (its confirmation sent half a minute of
// virtual time after it started); the order whose report fails is
// refunded; the order nobody confirms times out after its minute, in
// virtual time, and is refunded too.
func TestPaymentFlowOutcomes(t *testing.T) {
	env, payment, _ := flowEnv(t)
	env.SignalAfter(30*time.Second, "order-1", "confirmed", "yes")
	receipt, run := workflowtest.Run(env, payment, Order{ID: "order-1", Amount: 4200, Email: "ann@example.com"},
		&workflow.StartOpts{ID: "order-1", Queue: "payments"})
	if run.State != workflow.StateCompleted || receipt.EmailID != "msg-order-1" || receipt.Report != "order-1 paid 42.00" {
		t.Fatalf("order-1: %s %+v %s", run.State, receipt, run.Error)
	}
	for id, o := range map[string]Order{
		"order-2": {ID: "order-2", Amount: 990, Email: "bob@example.com", FailReport: true},
		"order-3": {ID: "order-3", Amount: 500, Email: "cy@example.com"}, // never confirmed
	} {
		before := env.Now()
		_, run := workflowtest.Run(env, payment, o, &workflow.StartOpts{ID: id, Queue: "payments"})
		if run.State != workflow.StateCompensated {
			t.Fatalf("%s: %s, want compensated: %s", id, run.State, run.Error)
		}
		if comps := env.Compensations(id); len(comps) != 1 || comps[0].Key != "compensate:refund" || comps[0].State != "completed" {
			t.Fatalf("%s: compensations %+v, want the refund", id, comps)
		}
		if waited := env.Now().Sub(before); id == "order-3" && waited < time.Minute {
			t.Fatalf("order-3 was refunded %s after it started, before its minute to confirm", waited)
		}
	}
	if n := testdb.Count(t, env.Pool(), `SELECT count(*) FROM refunds`); n != 2 {
		t.Fatalf("%d refunds, want 2", n)
	}
}

// Workers killed right after the provider charged (before the charge's
// checkpoint) and right after the payment's row committed: the charge
// step runs again, yet the provider charges once (the step's idempotency
// key); the payment's StepTx is not run again, and its row is written
// once.
func TestPaymentFlowSurvivesKills(t *testing.T) {
	env, payment, provider := flowEnv(t)
	env.CrashAfter("charge")
	env.CrashAfter("record")
	env.SignalAfter(time.Second, "order-1", "confirmed", "yes")
	_, run := workflowtest.Run(env, payment, Order{ID: "order-1", Amount: 4200, Email: "ann@example.com"},
		&workflow.StartOpts{ID: "order-1", Queue: "payments"})
	if run.State != workflow.StateCompleted {
		t.Fatalf("order-1: %s: %s", run.State, run.Error)
	}
	if n := env.Calls("order-1", "charge"); n != 2 {
		t.Fatalf("the charge step ran %d times, want 2 (killed before its checkpoint)", n)
	}
	if n := provider.Charges()["order-1"]; n != 1 {
		t.Fatalf("the provider charged %d times, want 1", n)
	}
	if n := env.Calls("order-1", "record"); n != 1 {
		t.Fatalf("the record StepTx ran %d times, want 1", n)
	}
	if n := testdb.Count(t, env.Pool(), `SELECT count(*) FROM payments WHERE order_id = 'order-1'`); n != 1 {
		t.Fatalf("%d payment rows, want 1", n)
	}
}
