package core_test

import (
	"context"
	"strings"
	"testing"

	"github.com/relayq/relay/testkit/testdb"
)

// Migration *_after_triggers_small_when: the real triggers'
// clauses (read back with pg_get_triggerdef and installed as shadow
// triggers that only log) fire, through PostgreSQL's own trigger
// machinery, for exactly the updates the old inline clauses (migration
// *_rules_cheap_per_statement and the schema before) fired for, on a
// domain wider than TestKeyUpdateTriggersFireAsBefore's: a state outside
// the machine, kinds renamed by the same update, rows with and without a
// run id.
func TestAfterTriggersShadowTriggersAgreeWithOldClauses(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
	}
	exec(`ALTER TABLE relay_jobs DISABLE TRIGGER USER`)
	exec(`CREATE TABLE shadow_log (tg text, id bigint)`)
	exec(`CREATE FUNCTION shadow_log() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO shadow_log VALUES (TG_NAME, NEW.id); RETURN NULL; END $$`)
	exec(`CREATE TABLE shadow_case AS
		WITH s(v) AS (VALUES ('queued'), ('claimed'), ('succeeded'), ('dead'), ('cancelled'), ('bogus')),
		     q(o, n) AS (VALUES ('a', 'a'), ('a', 'b')),
		     k(o, n) AS (VALUES (NULL, NULL), ('x', 'x'), ('x', 'y'), (NULL, 'x'), ('x', NULL)),
		     kd(o, n) AS (VALUES ('relay.workflow', 'relay.workflow'), ('w', 'w'),
		                         ('relay.workflow', 'w'), ('w', 'relay.workflow')),
		     r(run) AS (VALUES (true), (false))
		SELECT row_number() OVER () AS id, q.o AS oq, q.n AS nq, k.o AS ok, k.n AS nk,
		       os.v AS os, ns.v AS ns, kd.o AS okind, kd.n AS nkind, r.run
		FROM s AS os, s AS ns, q, k, kd, r`)
	exec(`INSERT INTO relay_jobs (id, kind, queue, args, state, ordering_key)
		SELECT id, okind, oq, CASE WHEN run THEN jsonb_build_object('run_id', 'r' || id) ELSE '{}' END, os, ok
		FROM shadow_case`)
	// Shadows of the real triggers (their clause and column list as
	// installed), logging instead of acting.
	for real, shadow := range map[string]string{
		"relay_jobs_key_update":      "shadow_new_key_update",
		"relay_jobs_key_update_note": "shadow_new_key_note",
		"relay_workflow_job_ended":   "shadow_new_wf",
	} {
		var def string
		if err := pool.QueryRow(ctx, `SELECT pg_get_triggerdef(oid) FROM pg_trigger
			WHERE tgrelid = 'relay_jobs'::regclass AND tgname = $1`, real).Scan(&def); err != nil {
			t.Fatal(err)
		}
		def = strings.Replace(def, " TRIGGER "+real+" ", " TRIGGER "+shadow+" ", 1)
		def = def[:strings.LastIndex(def, " EXECUTE FUNCTION ")] + " EXECUTE FUNCTION shadow_log()"
		exec(def)
	}
	// The old clauses, verbatim from the migrations before.
	exec(`CREATE TRIGGER shadow_old_key AFTER UPDATE OF state, queue, ordering_key ON relay_jobs FOR EACH ROW
		WHEN ((OLD.ordering_key IS NOT NULL OR NEW.ordering_key IS NOT NULL)
		      AND (OLD.queue IS DISTINCT FROM NEW.queue
		           OR OLD.ordering_key IS DISTINCT FROM NEW.ordering_key
		           OR (OLD.state <> NEW.state
		               AND OLD.state || '>' || NEW.state <> ALL ('{queued>claimed,claimed>dead}'::text[]))))
		EXECUTE FUNCTION shadow_log()`)
	exec(`CREATE TRIGGER shadow_old_wf AFTER UPDATE OF state ON relay_jobs FOR EACH ROW
		WHEN (NEW.state = ANY (ARRAY['dead', 'cancelled']) AND OLD.state IS DISTINCT FROM NEW.state
		      AND NEW.kind = 'relay.workflow')
		EXECUTE FUNCTION shadow_log()`)
	exec(`UPDATE relay_jobs AS j SET state = c.ns, queue = c.nq, ordering_key = c.nk, kind = c.nkind
		FROM shadow_case AS c WHERE j.id = c.id`)
	// Only the state set: the UPDATE OF lists are the same for both.
	exec(`UPDATE relay_jobs AS j SET state = c.os FROM shadow_case AS c WHERE j.id = c.id AND c.id % 7 = 0`)

	var cases int
	var keyDisagree, wfDisagree []string
	err := pool.QueryRow(ctx, `
		WITH f AS (
		    SELECT c.*, 
		           count(*) FILTER (WHERE l.tg = 'shadow_old_key') AS old_key,
		           count(*) FILTER (WHERE l.tg = 'shadow_new_key_note') AS new_note,
		           count(*) FILTER (WHERE l.tg = 'shadow_new_key_update') AS new_update,
		           count(*) FILTER (WHERE l.tg = 'shadow_old_wf') AS old_wf,
		           count(*) FILTER (WHERE l.tg = 'shadow_new_wf') AS new_wf
		    FROM shadow_case AS c LEFT JOIN shadow_log AS l ON l.id = c.id
		    GROUP BY c.id, c.oq, c.nq, c.ok, c.nk, c.os, c.ns, c.okind, c.nkind, c.run)
		SELECT count(*),
		       coalesce(array_agg(format('%s>%s q %s>%s k %s>%s: old %s note %s update %s', os, ns, oq, nq, ok, nk, old_key, new_note, new_update))
		                FILTER (WHERE old_key <> new_note OR old_key <> new_update), '{}'),
		       -- the function's first test now does what the clause's did:
		       -- an event it returns early for counts as not fired
		       coalesce(array_agg(format('%s>%s kind %s>%s run %s: old %s new %s', os, ns, okind, nkind, run, old_wf, new_wf))
		                FILTER (WHERE (old_wf > 0 AND run) <> (new_wf > 0 AND NOT (os = ns OR NOT run))), '{}')
		FROM f`).Scan(&cases, &keyDisagree, &wfDisagree)
	if err != nil {
		t.Fatal(err)
	}
	if cases != 6*6*2*5*4*2 {
		t.Fatalf("%d cases", cases)
	}
	if len(keyDisagree) > 0 {
		t.Errorf("key triggers disagree with the old clause on %d updates: %v", len(keyDisagree), keyDisagree)
	}
	if len(wfDisagree) > 0 {
		t.Errorf("relay_workflow_job_ended disagrees with the old clause on %d updates: %v", len(wfDisagree), wfDisagree)
	}
	var extra int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM shadow_log AS l JOIN shadow_case AS c USING (id)
		WHERE l.tg = 'shadow_new_wf' AND c.os = c.ns`).Scan(&extra); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d cases; relay_workflow_job_ended now queued for %d same-state updates the old clause skipped", cases, extra)
}

// A workflow job moving to dead or cancelled from every state (the state
// machine off for the moves it refuses) fails its unfinished run exactly
// when the state changed, as the old clause had it; a run already gone, a
// run whose job_id names another job, and a kind renamed by the same
// update are left alone.
func TestAfterTriggersWorkflowJobEndedFromEveryState(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
	}
	type tc struct {
		from, to      string
		kind, newKind string
		run, otherJob bool
		wantFailed    bool
	}
	var cases []tc
	for _, from := range []string{"queued", "claimed", "succeeded", "dead", "cancelled"} {
		for _, to := range []string{"dead", "cancelled"} {
			cases = append(cases, tc{from: from, to: to, kind: "relay.workflow", newKind: "relay.workflow", run: true, wantFailed: from != to})
			cases = append(cases, tc{from: from, to: to, kind: "relay.workflow", newKind: "relay.workflow"})                            // run deleted
			cases = append(cases, tc{from: from, to: to, kind: "relay.workflow", newKind: "relay.workflow", run: true, otherJob: true}) // id reuse
			cases = append(cases, tc{from: from, to: to, kind: "relay.workflow", newKind: "renamed", run: true})
			cases = append(cases, tc{from: from, to: to, kind: "renamed", newKind: "relay.workflow", run: true, wantFailed: from != to})
		}
	}
	exec(`ALTER TABLE relay_jobs DISABLE TRIGGER USER`)
	for i, c := range cases {
		id := int64(1000 + i)
		jobOf := id
		if c.otherJob {
			jobOf = id + 100000
		}
		final := c.from == "succeeded" || c.from == "dead" || c.from == "cancelled"
		exec(`INSERT INTO relay_jobs (id, kind, queue, args, state, finalized_at, lease_token, lease_expires_at, attempt)
			VALUES ($1::bigint, $2, 'q', jsonb_build_object('run_id', 'run' || $1::bigint::text), $3::text,
			        CASE WHEN $4 THEN now() END,
			        CASE WHEN $3 = 'claimed' THEN gen_random_uuid() END,
			        CASE WHEN $3 = 'claimed' THEN now() + interval '1 hour' END, 1)`, id, c.kind, c.from, final)
		if c.run {
			exec(`INSERT INTO relay_workflow_runs (id, workflow, state, input, queue, job_id, started_at)
				VALUES ('run' || $1::bigint::text, 'wf', 'pending', '{}', 'q', $2::bigint, NULL)`, id, jobOf)
		}
	}
	exec(`ALTER TABLE relay_jobs ENABLE TRIGGER USER`)
	exec(`ALTER TABLE relay_jobs DISABLE TRIGGER relay_jobs_state_machine`)
	exec(`ALTER TABLE relay_jobs DISABLE TRIGGER relay_jobs_cold_rules`)
	for i, c := range cases {
		id := int64(1000 + i)
		exec(`UPDATE relay_jobs SET state = $2, kind = $3,
			finalized_at = now(), lease_token = NULL, lease_expires_at = NULL WHERE id = $1`, id, c.to, c.newKind)
		var state string
		err := pool.QueryRow(ctx, `SELECT coalesce((SELECT state FROM relay_workflow_runs WHERE id = 'run' || $1::bigint::text), 'none')`, id).Scan(&state)
		if err != nil {
			t.Fatal(err)
		}
		got := state == "failed"
		if got != c.wantFailed {
			t.Errorf("%+v: run %s, want failed %v", c, state, c.wantFailed)
		}
	}
}
