package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/testkit/testdb"
)

// The update audit of `relay prove workflow` catches a broken update: after
// a small clean proof (its schema kept), each tampering below, made in a
// transaction the audit then reads and rolled back afterwards, is counted
// by update_violations, one row naming the tampered run; the clean
// database counts none.
func TestUpdateAuditCatchesTampering(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	url := testdb.URL(t)
	f := runProof(t, bin, "workflow", "--database-url", url, "--runs", "12", "--processes", "1", "--concurrency", "4",
		"--sleep", "50ms", "--lease", "1s", "--keep")
	// Runs 1, 4, 7 and 10 take an update (one in three).
	if f["runs"] != "12" || f["update_violations"] != "0" || f["updates"] != "4" || f["lost"] != "0" {
		t.Fatalf("the proof is not clean: %v", f)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var schema string
	if err := pool.QueryRow(ctx, `SELECT nspname FROM pg_namespace WHERE nspname LIKE 'relay\_prove\_%'`).Scan(&schema); err != nil {
		t.Fatalf("the proof's kept schema: %v", err)
	}
	queries := proveWFQueries()
	// audit runs the update audit after tamper, in one transaction rolled
	// back afterwards.
	audit := func(tamper string, args ...any) []updateViolation {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, schema); err != nil {
			t.Fatal(err)
		}
		if tamper != "" {
			if tag, err := tx.Exec(ctx, tamper, args...); err != nil || tag.RowsAffected() == 0 {
				t.Fatalf("tamper %q: %v (%d rows)", tamper, err, tag.RowsAffected())
			}
		}
		vs, err := updateViolations(ctx, tx, queries)
		if err != nil {
			t.Fatal(err)
		}
		return vs
	}
	if vs := audit(""); len(vs) != 0 {
		t.Fatalf("the clean proof's audit counts %v", vs)
	}
	const updated, plain = "pay-000004", "pay-000002" // a run that took an update, one that did not
	for _, c := range []struct {
		what   string
		tamper string
		run    string
	}{
		{"the update's record deleted from the run's history",
			`DELETE FROM relay_workflow_steps WHERE run_id = $1 AND key = 'update:address#1'`, updated},
		{"the update's effect applied twice",
			`INSERT INTO prove_wf_effects (run_id, kind, exec_id, step_run) SELECT run_id, kind, exec_id, step_run FROM prove_wf_effects WHERE run_id = $1 AND kind = 'address'`, updated},
		{"the update answered and never applied",
			`DELETE FROM prove_wf_effects WHERE run_id = $1 AND kind = 'address'`, updated},
		{"the update lost: its caller never answered",
			`UPDATE prove_wf_updates SET answer = NULL, error = 'lost' WHERE run_id = $1`, updated},
		{"the update's row answered otherwise than its caller was",
			`UPDATE relay_workflow_updates SET response = '"applied elsewhere"' WHERE run_id = $1`, updated},
		{"an update marked answered that was never sent nor applied",
			`INSERT INTO relay_workflow_updates (run_id, name, request, state, response, handled_at) VALUES ($1, 'address', '"street"', 'completed', '"applied street"', now())`, plain},
	} {
		vs := audit(c.tamper, c.run)
		if len(vs) != 1 || vs[0].run != c.run {
			t.Errorf("%s: the audit counts %v, want one violation naming %s", c.what, vs, c.run)
		}
	}
	// The tamperings left nothing behind.
	if vs := audit(""); len(vs) != 0 {
		t.Fatalf("the audit after the tamperings counts %v", vs)
	}
}
