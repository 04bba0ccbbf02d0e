package admin

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Migration *_after_triggers_small_when, installed into schema
// relay by an owner and used by an application role that owns nothing
// (docs/deploy.md's grants): relay_jobs_key_moved lands in relay, the key
// triggers' clauses name it there, and a keyed job's claim and completion
// hand its key to the next job as before.
func TestKeyedJobsInSchemaAsRoleThatOwnsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRoleDB(t)
	var defs string
	var inPublic int
	if _, err := r.super.Exec(ctx, `SET search_path = pg_catalog`); err != nil {
		t.Fatal(err)
	}
	if err := r.super.QueryRow(ctx, `
		SELECT string_agg(pg_get_triggerdef(oid), E'\n'),
		       (SELECT count(*) FROM pg_proc WHERE proname = 'relay_jobs_key_moved' AND pronamespace = 'public'::regnamespace)
		FROM pg_trigger WHERE tgrelid = 'relay.relay_jobs'::regclass
		  AND tgname IN ('relay_jobs_key_update', 'relay_jobs_key_update_note')`).Scan(&defs, &inPublic); err != nil {
		t.Fatal(err)
	}
	if strings.Count(defs, "relay.relay_jobs_key_moved(") != 2 || inPublic != 0 {
		t.Errorf("clauses %s; %d relay_jobs_key_moved in public", defs, inPublic)
	}
	if _, err := r.super.Exec(ctx, `SET search_path = relay, public`); err != nil {
		t.Fatal(err)
	}
	app, err := pgxpool.New(ctx, r.appURL)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	exec := func(p *pgxpool.Pool, sql string) {
		t.Helper()
		if _, err := p.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	waiting := func(id int) bool {
		t.Helper()
		var w bool
		if err := app.QueryRow(ctx, `SELECT key_waiting FROM relay_jobs WHERE id = $1`, id).Scan(&w); err != nil {
			t.Fatal(err)
		}
		return w
	}
	exec(app, `INSERT INTO relay_jobs (id, kind, queue, ordering_key) VALUES (1, 'k', 'q', 'key'), (2, 'k', 'q', 'key'), (3, 'k', 'q', 'key')`)
	exec(app, `UPDATE relay_jobs SET state = 'claimed', attempt = 1, attempted_at = now(), lease_token = gen_random_uuid(),
		lease_expires_at = now() + interval '1 minute' WHERE id = 1`)
	if waiting(1) || !waiting(2) || !waiting(3) {
		t.Fatalf("after the claim: waiting %v %v %v, want false true true", waiting(1), waiting(2), waiting(3))
	}
	exec(app, `UPDATE relay_jobs SET state = 'succeeded', finalized_at = now(), lease_token = NULL, lease_expires_at = NULL WHERE id = 1`)
	if waiting(2) || !waiting(3) {
		t.Fatalf("after the head succeeded: waiting %v %v, want false true", waiting(2), waiting(3))
	}
	// The key moved to another queue: job 3 heads its key there.
	exec(app, `UPDATE relay_jobs SET queue = 'q2' WHERE id = 3`)
	if waiting(3) {
		t.Fatalf("job 3 moved to q2 still waits")
	}
	// An admin cancel of the head, by the API's transition: the next job heads.
	exec(app, `INSERT INTO relay_jobs (id, kind, queue, ordering_key) VALUES (4, 'k', 'q', 'key')`)
	exec(app, `UPDATE relay_jobs SET state = 'cancelled', finalized_at = now() WHERE id = 2`)
	if waiting(4) {
		t.Fatalf("job 4 still waits behind cancelled job 2")
	}

	// A session without relay in its search_path (psql as the app role)
	// may still cancel an unkeyed job by its qualified name: the clause's
	// function is bound by OID, its body names nothing of Relay's.
	noPath, err := pgxpool.New(ctx, strings.Replace(r.appURL, "search_path=relay", "search_path=public", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer noPath.Close()
	exec(app, `INSERT INTO relay_jobs (id, kind, queue) VALUES (10, 'k', 'q')`)
	exec(noPath, `UPDATE relay.relay_jobs SET state = 'cancelled', finalized_at = now() WHERE id = 10`)
}
