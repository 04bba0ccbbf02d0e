package core_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayq/relay/testkit/testdb"
)

// The state machine's WHEN clause refuses exactly the writes its function
// refused when it ran for every row: each update below, on rows in every
// state and on rows that already break a rule (written with the triggers
// off), gets the same answer — taken, or the same SQLSTATE and message —
// from the trigger with its WHEN clause as from the same trigger without
// it (the function alone, as before the clause).
func TestStateMachineWhenAgreesWithTheFunction(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck

	lease := `lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute'`
	noLease := `lease_token = NULL, lease_expires_at = NULL`
	// Rows: valid in each state, then one per broken rule.
	valid := []string{
		`(kind) VALUES ('q')`,
		`(kind, state, attempt, lease_token, lease_expires_at) VALUES ('c', 'claimed', 1, gen_random_uuid(), now() + interval '1 minute')`,
		`(kind, state, attempt, finalized_at) VALUES ('s', 'succeeded', 1, now())`,
		`(kind, state, attempt, finalized_at) VALUES ('d', 'dead', 1, now())`,
		`(kind, state, finalized_at) VALUES ('x', 'cancelled', now())`,
		`(kind, ordering_key, tags, unique_key, unique_states) VALUES ('k', 'key', '{a,b}', 'u', '{queued}')`,
	}
	broken := []string{
		`(kind) VALUES ('')`,
		`(kind, queue) VALUES ('b', '')`,
		`(kind, state) VALUES ('b', 'bogus')`,
		`(kind, priority) VALUES ('b', -1)`,
		`(kind, attempt) VALUES ('b', -1)`,
		`(kind, max_attempts) VALUES ('b', 0)`,
		`(kind, state, attempt) VALUES ('b', 'claimed', 1)`,
		`(kind, lease_token, lease_expires_at) VALUES ('b', gen_random_uuid(), now())`,
		`(kind, finalized_at) VALUES ('b', now())`,
		`(kind, state) VALUES ('b', 'dead')`,
		`(kind, unique_key) VALUES ('b', 'u')`,
		`(kind, ordering_key) VALUES ('b', '')`,
		`(kind, tags) VALUES ('b', '{NULL}')`,
		`(kind, tags) VALUES ('b', array_fill('t'::text, ARRAY[33]))`,
		`(kind, run_at) VALUES ('b', 'infinity')`,
		`(kind, created_at) VALUES ('b', '-infinity')`,
		`(kind, attempted_at) VALUES ('b', 'infinity')`,
		`(kind, state, attempt, lease_token, lease_expires_at) VALUES ('b', 'claimed', 1, gen_random_uuid(), 'infinity')`,
		`(kind, state, finalized_at) VALUES ('b', 'dead', 'infinity')`,
		`(kind, attempt, tags) VALUES ('b', -1, '{""}')`,
	}
	var ids []int64
	insert := func(rows []string) {
		for _, r := range rows {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO relay_jobs `+r+` RETURNING id`).Scan(&id); err != nil {
				t.Fatalf("insert %s: %v", r, err)
			}
			ids = append(ids, id)
		}
	}
	// Inserts are queued (another trigger): the rows in other states, and
	// the broken ones, are written with the triggers off.
	execTx(t, tx, `ALTER TABLE relay_jobs DISABLE TRIGGER USER`)
	insert(valid)
	insert(broken)
	execTx(t, tx, `ALTER TABLE relay_jobs ENABLE TRIGGER USER`)

	sets := []string{
		// Transitions, legal and not, with and without the columns they need.
		`state = 'claimed', attempt = attempt + 1, ` + lease,
		`state = 'claimed'`,
		`state = 'succeeded', finalized_at = now(), ` + noLease,
		`state = 'dead', finalized_at = now(), ` + noLease,
		`state = 'cancelled', finalized_at = now(), ` + noLease,
		`state = 'queued', finalized_at = NULL, ` + noLease,
		`state = 'queued'`, `state = 'succeeded'`, `state = 'dead'`, `state = 'cancelled'`,
		`state = 'bogus'`, `state = state`,
		// Every rule, broken and mended.
		`kind = ''`, `kind = repeat('k', 256)`, `kind = 'ok'`, `kind = 'é'`,
		`queue = ''`, `queue = repeat('q', 129)`, `queue = 'other'`,
		`priority = -1`, `priority = 0`, `priority = 5`,
		`attempt = -1`, `attempt = 0`, `attempt = attempt + 1`,
		`max_attempts = 0`, `max_attempts = 1`,
		lease, noLease, `lease_token = NULL`, `lease_expires_at = NULL`, `lease_expires_at = now()`,
		`finalized_at = now()`, `finalized_at = NULL`, `finalized_at = 'infinity'`,
		`unique_key = 'u2'`, `unique_key = NULL`, `unique_states = '{queued}'`, `unique_states = NULL`,
		`unique_key = NULL, unique_states = NULL`, `unique_key = 'u3', unique_states = '{queued}'`,
		`ordering_key = ''`, `ordering_key = repeat('o', 501)`, `ordering_key = NULL`, `ordering_key = 'k2'`,
		`tags = '{NULL}'`, `tags = '{""}'`, `tags = array_fill('t'::text, ARRAY[33])`, `tags = '{}'`, `tags = '{a}'`,
		`run_at = 'infinity'`, `run_at = '-infinity'`, `run_at = now()`,
		`created_at = 'infinity'`, `created_at = now()`,
		`attempted_at = '-infinity'`, `attempted_at = NULL`, `attempted_at = now()`,
		`lease_expires_at = 'infinity'`,
		// Mending a hot rule while a cold one breaks, and the reverse.
		`attempt = 0, kind = ''`, `attempt = 0, tags = '{}'`, `kind = 'ok', attempt = -1`,
		`state = 'queued', finalized_at = NULL, ` + noLease + `, tags = '{""}'`,
		`run_at = now(), priority = -1`,
	}

	answers := func() map[string]string {
		got := map[string]string{}
		for _, id := range ids {
			for _, set := range sets {
				execTx(t, tx, `SAVEPOINT attack`)
				_, err := tx.Exec(ctx, `UPDATE relay_jobs SET `+set+` WHERE id = $1`, id)
				answer := "taken"
				var pgErr *pgconn.PgError
				switch {
				case errors.As(err, &pgErr):
					answer = pgErr.Code + " " + pgErr.Message
				case err != nil:
					t.Fatalf("job %d, SET %s: %v", id, set, err)
				}
				execTx(t, tx, `ROLLBACK TO SAVEPOINT attack`)
				got[fmt.Sprintf("job %d, SET %s", id, set)] = answer
			}
		}
		return got
	}
	withWhen := answers()

	var def string
	if err := tx.QueryRow(ctx, `SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'relay_jobs'::regclass AND tgname = 'relay_jobs_state_machine'`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	w, e := strings.Index(def, " WHEN ("), strings.LastIndex(def, " EXECUTE FUNCTION ")
	if w < 0 || e < w {
		t.Fatalf("no WHEN clause in %s", def)
	}
	execTx(t, tx, `DROP TRIGGER relay_jobs_state_machine ON relay_jobs`)
	execTx(t, tx, def[:w]+def[e:])
	plain := answers()

	refused := 0
	for k, want := range plain {
		if want != "taken" {
			refused++
		}
		if got := withWhen[k]; got != want {
			t.Errorf("%s: with the WHEN clause %q, the function alone %q", k, got, want)
		}
	}
	if refused < len(plain)/4 {
		t.Fatalf("only %d of %d writes refused: the attack does not reach the rules", refused, len(plain))
	}
}

func execTx(t *testing.T, tx pgx.Tx, sql string) {
	t.Helper()
	if _, err := tx.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
