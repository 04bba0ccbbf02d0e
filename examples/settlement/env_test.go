package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
	"github.com/relayq/relay/workflowtest"
)

// A settlement started on the 15th of January with WaitForMonthEnd sleeps
// until 02:00 New York time on the 31st, in virtual time, then settles the
// month: the settlement row is written at the month's end (its settled_at
// is the database's virtual now()), and the notification once.
func TestSettlementSleepsUntilMonthEnd(t *testing.T) {
	loc, err := time.LoadLocation(timeZone)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2027, 1, 15, 10, 0, 0, 0, loc)
	env := workflowtest.New(t, testdb.URL(t), &workflowtest.Config{Start: start, Queues: map[string]int{"finance": 2}})
	ctx := context.Background()
	if _, err := env.Pool().Exec(ctx, tables); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Pool().Exec(ctx, `INSERT INTO entries SELECT 'main', '2027-01', a FROM unnest(ARRAY[1200, -300, 4500]) a`); err != nil {
		t.Fatal(err)
	}
	wf := register(env.Registry(), env.Pool(), loc, io.Discard)
	began := time.Now()
	s, run := workflowtest.Run(env, wf, SettleInput{Ledger: "main", FireTime: start, WaitForMonthEnd: true},
		&workflow.StartOpts{ID: "settlement:2027-01", Queue: "finance"})
	t.Logf("a settlement that slept %s of virtual time took %s of wall time", env.Now().Sub(start).Round(time.Hour), time.Since(began))
	if run.State != workflow.StateCompleted {
		t.Fatalf("run %s: %s", run.State, run.Error)
	}
	if s.Period != "2027-01" || s.Entries != 3 || s.Total != 5400 || s.SettledBy != "settlement:2027-01" {
		t.Fatalf("settlement %+v", s)
	}
	if run.Steps[0].Key != "month-end" || run.Steps[0].Kind != "sleep" {
		t.Fatalf("first step %s %s, want the month-end sleep", run.Steps[0].Kind, run.Steps[0].Key)
	}
	close := time.Date(2027, 1, 31, 2, 0, 0, 0, loc)
	var settledAt time.Time
	if err := env.Pool().QueryRow(ctx, `SELECT settled_at FROM settlements WHERE period = '2027-01'`).Scan(&settledAt); err != nil {
		t.Fatal(err)
	}
	if settledAt.Before(close) || settledAt.After(close.Add(time.Hour)) {
		t.Fatalf("settled at %s, want the month's end %s", settledAt.In(loc), close)
	}
	if n := testdb.Count(t, env.Pool(), `SELECT count(*) FROM notifications`); n != 1 {
		t.Fatalf("%d notifications, want 1", n)
	}
}
