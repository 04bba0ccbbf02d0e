package core_test

import (
	"context"
	"strings"
	"testing"

	"github.com/relayq/relay/testkit/testdb"
)

// A trigger's WHEN clause is planned again, from its stored node text, by
// every statement that may fire it (about 5 µs per kB; docs/benchmarks.md,
// "What a trigger's WHEN costs a small statement"). The claim and the
// outcome are the hot updates: this keeps the clause text they plan from
// growing unnoticed. Each AFTER trigger they may fire tests little in its
// clause (a function called from it does the rest), and all the clauses
// one of them plans stay within a budget: 13.4 kB before migration
// *_after_triggers_small_when, 10.0 kB after.
func TestHotUpdatesPlanLittleTriggerText(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	const afterMax, totalMax = 1500, 10500
	for name, cols := range map[string][]string{
		"claim":   {"state", "attempt", "attempted_at", "attempted_by", "lease_token", "lease_expires_at"},
		"outcome": {"state", "finalized_at", "lease_token", "lease_expires_at"},
		"retry":   {"state", "run_at", "finalized_at", "lease_token", "lease_expires_at", "last_error", "history"},
	} {
		// The UPDATE triggers a statement setting cols may fire: those
		// with no UPDATE OF list, and those whose list names one of cols.
		rows, err := pool.Query(ctx, `
			SELECT tg.tgname::text, (tg.tgtype & 2) <> 0, coalesce(length(tg.tgqual::text), 0)
			FROM pg_trigger AS tg
			WHERE tg.tgrelid = 'relay_jobs'::regclass AND NOT tg.tgisinternal
			  AND (tg.tgtype & 16) <> 0
			  AND (cardinality(tg.tgattr::int2[]) = 0 OR EXISTS (
			      SELECT 1 FROM pg_attribute AS a
			      WHERE a.attrelid = tg.tgrelid AND a.attnum = ANY (tg.tgattr::int2[])
			        AND a.attname = ANY ($1::text[])))`, cols)
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for rows.Next() {
			var tg string
			var before bool
			var n int
			if err := rows.Scan(&tg, &before, &n); err != nil {
				t.Fatal(err)
			}
			total += n
			if !before && n > afterMax {
				t.Errorf("%s: AFTER trigger %s has a %d-byte WHEN clause (at most %d: test what rules most rows out, and call a function for the rest)", name, tg, n, afterMax)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if total > totalMax {
			t.Errorf("%s plans %d bytes of trigger WHEN clauses, more than %d", name, total, totalMax)
		}
		t.Logf("%s plans %d bytes of WHEN clauses", name, total)
	}
}

// The ordering keys' update triggers fire for exactly the updates their
// old, all-inline clause named (migration *_rules_cheap_per_statement):
// every combination of queue, key and state change agrees.
func TestKeyUpdateTriggersFireAsBefore(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	var disagree []string
	var cases int
	err := pool.QueryRow(ctx, `
		WITH s(v) AS (VALUES ('queued'), ('claimed'), ('succeeded'), ('dead'), ('cancelled')),
		     q(o, n) AS (VALUES ('a', 'a'), ('a', 'b')),
		     k(o, n) AS (VALUES (NULL, NULL), ('x', 'x'), ('x', 'y'), (NULL, 'x'), ('x', NULL)),
		     c AS (
		         SELECT q.o AS oq, q.n AS nq, k.o AS ok, k.n AS nk, os.v AS os, ns.v AS ns
		         FROM q, k, s AS os, s AS ns),
		     judged AS (
		         SELECT format('%s>%s queue %s>%s key %s>%s', os, ns, oq, nq, ok, nk) AS what,
		                coalesce((ok IS NOT NULL OR nk IS NOT NULL)
		                    AND (oq IS DISTINCT FROM nq OR ok IS DISTINCT FROM nk
		                         OR (os <> ns AND os || '>' || ns <> ALL ('{queued>claimed,claimed>dead}'::text[]))),
		                    false) AS old_fires,
		                coalesce((ok IS NOT NULL OR nk IS NOT NULL)
		                    AND relay_jobs_key_moved(oq, nq, ok, nk, os, ns), false) AS new_fires
		         FROM c)
		SELECT count(*), coalesce(array_agg(what) FILTER (WHERE old_fires <> new_fires), '{}')
		FROM judged`).Scan(&cases, &disagree)
	if err != nil {
		t.Fatal(err)
	}
	if cases != 2*5*5*5 {
		t.Fatalf("judged %d cases, want %d", cases, 2*5*5*5)
	}
	if len(disagree) > 0 {
		t.Errorf("the key triggers' clause now disagrees with the old one on %d updates: %v", len(disagree), disagree)
	}
	// The clause on the triggers is the one judged above.
	for _, name := range []string{"relay_jobs_key_update", "relay_jobs_key_update_note"} {
		tr := readTrigger(t, pool, name)
		if !strings.Contains(tr.when, "(old.ordering_key is not null) or (new.ordering_key is not null)") ||
			!strings.Contains(tr.when, "relay_jobs_key_moved(old.queue, new.queue, old.ordering_key, new.ordering_key, old.state, new.state)") {
			t.Errorf("%s: WHEN %s", name, tr.when)
		}
	}
}
