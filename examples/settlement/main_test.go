package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func TestNextFireTimes(t *testing.T) {
	var b bytes.Buffer
	if err := printNext(&b, time.Date(2027, 1, 15, 0, 0, 0, 0, time.UTC), 3); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Sun 2027-01-31 02:00 EST", "Sun 2027-02-28 02:00 EST", "Wed 2027-03-31 02:00 EDT"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in\n%s", want, b.String())
		}
	}
}

// Two runs of the example, each triggering the schedule twice and starting
// a fire again, make one settlement each time.
func TestSettlesOnce(t *testing.T) { testdb.RunTwice(t, run, check) }

func check(t *testing.T, out string) {
	t.Helper()
	for _, want := range []string{
		"settled ledger main for ",
		"was already settled by run settlement:month-end-settlement:",
		"steps: lock-ledger(completed) compute(completed) write-settlement(completed) notify(completed)",
		"settlements recorded: 1 (3 starts, 2 runs, 2 notifications, one effect)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in output:\n%s", want, out)
		}
	}
}

// The schedule's fires start workflow runs whose ids come from the fire
// times; the database holds one settlement, written by the first fire's
// run, each run's four steps in order, and one run for the fire started twice.
func TestScheduleStartsWorkflow(t *testing.T) {
	url := testdb.URL(t)
	var b bytes.Buffer
	if err := run(context.Background(), url, &b); err != nil {
		t.Fatalf("run: %v\n%s", err, b.String())
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	var settledBy string
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*), min(run_id) FROM relay_example_settlement.settlements`).Scan(&n, &settledBy); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d settlement rows, want 1\n%s", n, b.String())
	}
	// The run ids, oldest first, are "<workflow>:<schedule>:<fire time>" of
	// the two triggered fires; the duplicate start made no third.
	rows, err := pool.Query(ctx, `SELECT r.id, string_agg(s.key || '=' || s.state, ',' ORDER BY s.position)
		FROM relay_example_settlement.relay_workflow_runs r
		JOIN relay_example_settlement.relay_workflow_steps s ON s.run_id = r.id
		WHERE r.state = 'completed' GROUP BY r.id, r.created_at ORDER BY r.created_at`)
	if err != nil {
		t.Fatal(err)
	}
	var ids, timelines []string
	for rows.Next() {
		var id, tl string
		if err := rows.Scan(&id, &tl); err != nil {
			t.Fatal(err)
		}
		ids, timelines = append(ids, id), append(timelines, tl)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 {
		t.Fatalf("completed runs %v, want 2\n%s", ids, b.String())
	}
	var runs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_example_settlement.relay_workflow_runs`).Scan(&runs); err != nil {
		t.Fatal(err)
	}
	if runs != 2 {
		t.Errorf("%d runs, want 2 (the fire started twice is one run)", runs)
	}
	for i, id := range ids {
		fire, ok := strings.CutPrefix(id, "settlement:month-end-settlement:")
		if !ok {
			t.Errorf("run id %q is not derived from the fire", id)
		} else if _, err := time.Parse(time.RFC3339Nano, fire); err != nil {
			t.Errorf("run id %q: fire time: %v", id, err)
		}
		if want := "lock-ledger=completed,compute=completed,write-settlement=completed,notify=completed"; timelines[i] != want {
			t.Errorf("run %s timeline %s, want %s", id, timelines[i], want)
		}
	}
	if settledBy != ids[0] {
		t.Errorf("settled by %q, want the first fire's run %q", settledBy, ids[0])
	}
	var locked int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_example_settlement.ledgers WHERE locked_by IS NOT NULL`).Scan(&locked); err != nil {
		t.Fatal(err)
	}
	if locked != 0 {
		t.Errorf("%d ledgers left locked", locked)
	}
}
