package core_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

// columnsFor sets the columns that must agree with each state (the rules of
// relay_jobs_broken_rule), so that only the transition check decides.
var columnsFor = map[core.JobState]string{
	core.StateQueued:    `lease_token = NULL, lease_expires_at = NULL, finalized_at = NULL`,
	core.StateClaimed:   `lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute', finalized_at = NULL`,
	core.StateSucceeded: `lease_token = NULL, lease_expires_at = NULL, finalized_at = now()`,
	core.StateDead:      `lease_token = NULL, lease_expires_at = NULL, finalized_at = now()`,
	core.StateCancelled: `lease_token = NULL, lease_expires_at = NULL, finalized_at = now()`,
}

// pathTo reaches each state from queued by legal steps only.
var pathTo = map[core.JobState][]core.JobState{
	core.StateQueued:    nil,
	core.StateClaimed:   {core.StateClaimed},
	core.StateSucceeded: {core.StateClaimed, core.StateSucceeded},
	core.StateDead:      {core.StateClaimed, core.StateDead},
	core.StateCancelled: {core.StateCancelled},
}

// TestStateMachine walks every pair of states through raw SQL: the database
// allows exactly the transitions of core.JobState.CanTransitionTo, and those are exactly
// the rows of docs/state-machine.md.
func TestStateMachine(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	set := func(id int64, to core.JobState) error {
		_, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = $2, `+columnsFor[to]+` WHERE id = $1`, id, string(to))
		return err
	}
	for _, from := range core.States() {
		for _, to := range core.States() {
			if from == to {
				continue
			}
			var id int64
			if err := pool.QueryRow(ctx, `INSERT INTO relay_jobs (kind) VALUES ('walk') RETURNING id`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			for _, step := range pathTo[from] {
				if err := set(id, step); err != nil {
					t.Fatalf("reaching %s: step to %s refused: %v", from, step, err)
				}
			}
			err := set(id, to)
			legal := from.CanTransitionTo(to)
			var pgErr *pgconn.PgError
			switch {
			case legal && err != nil:
				t.Errorf("%s → %s is legal but refused: %v", from, to, err)
			case !legal && err == nil:
				t.Errorf("%s → %s is illegal but allowed", from, to)
			case !legal && (!errors.As(err, &pgErr) || pgErr.Code != "RLY01"):
				t.Errorf("%s → %s refused with %v, want SQLSTATE RLY01", from, to, err)
			}
		}
	}

	// Jobs are inserted queued, or claimed for a first attempt with a
	// lease.
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, state, attempt, attempted_at, lease_token, lease_expires_at)
		VALUES ('walk', 'claimed', 1, now(), gen_random_uuid(), now() + interval '1 minute')`); err != nil {
		t.Errorf("insert claimed for a first attempt refused: %v", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, state, finalized_at) VALUES ('walk', 'succeeded', now())`); err == nil {
		t.Error("insert as succeeded allowed")
	}
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, state) VALUES ('walk', 'running')`); err == nil {
		t.Error("unknown state allowed")
	}

	// The documented table lists exactly the legal transitions.
	doc, err := os.ReadFile("../docs/state-machine.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[[2]core.JobState]bool{}
	row := regexp.MustCompile(`(?m)^\| (\w+) \| (\w+) \|`)
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		if m[1] == "from" {
			continue
		}
		documented[[2]core.JobState{core.JobState(m[1]), core.JobState(m[2])}] = true
	}
	for _, from := range core.States() {
		for _, to := range core.States() {
			if from.CanTransitionTo(to) != documented[[2]core.JobState{from, to}] {
				t.Errorf("docs/state-machine.md and core disagree on %s → %s", from, to)
			}
		}
	}
}

// Every rule of a job row holds for raw SQL too, on insert and on update,
// and a broken one fails with SQLSTATE 23514 as a CHECK constraint would.
// The rules live in the triggers, not in CHECK constraints: PostgreSQL
// rebuilds a table's CHECKs from text at the start of every statement that
// writes it, which cost 16% of its CPU under a steady load of small
// statements (migration *_rules_in_triggers).
func TestJobRulesHold(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	var checks int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE conrelid = 'relay_jobs'::regclass AND contype = 'c'`).Scan(&checks); err != nil {
		t.Fatal(err)
	}
	if checks != 0 {
		t.Errorf("relay_jobs has %d CHECK constraints; each costs every writing statement a parse (keep the rules in relay_jobs_broken_rule)", checks)
	}
	insert := func(t *testing.T, sql string) int64 {
		t.Helper()
		var id int64
		if err := pool.QueryRow(ctx, sql).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	queued := insert(t, `INSERT INTO relay_jobs (kind) VALUES ('rules') RETURNING id`)
	claimed := insert(t, `INSERT INTO relay_jobs (kind) VALUES ('rules') RETURNING id`)
	done := insert(t, `INSERT INTO relay_jobs (kind) VALUES ('rules') RETURNING id`)
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'claimed', attempt = 1, lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute' WHERE id = ANY($1)`, []int64{claimed, done}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'succeeded', lease_token = NULL, lease_expires_at = NULL, finalized_at = now() WHERE id = $1`, done); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, sql string }{
		{"empty kind", `INSERT INTO relay_jobs (kind) VALUES ('')`},
		{"long queue", `INSERT INTO relay_jobs (kind, queue) VALUES ('k', repeat('q', 129))`},
		{"negative priority", `INSERT INTO relay_jobs (kind, priority) VALUES ('k', -1)`},
		{"no attempts", `INSERT INTO relay_jobs (kind, max_attempts) VALUES ('k', 0)`},
		{"empty ordering key", `INSERT INTO relay_jobs (kind, ordering_key) VALUES ('k', '')`},
		{"unique key without states", `INSERT INTO relay_jobs (kind, unique_key) VALUES ('k', 'u')`},
		{"queued with a lease", `INSERT INTO relay_jobs (kind, lease_token, lease_expires_at) VALUES ('k', gen_random_uuid(), now())`},
		{"one bad row in a batch", `INSERT INTO relay_jobs (kind) SELECT CASE WHEN g = 500 THEN '' ELSE 'k' END FROM generate_series(1, 1000) g`},
		{"claimed without a lease", `UPDATE relay_jobs SET lease_token = NULL WHERE id = ` + itoa(claimed)},
		{"claimed lease without expiry", `UPDATE relay_jobs SET lease_expires_at = NULL WHERE id = ` + itoa(claimed)},
		{"final without finalized_at", `UPDATE relay_jobs SET finalized_at = NULL WHERE id = ` + itoa(done)},
		{"queued with finalized_at", `UPDATE relay_jobs SET finalized_at = now() WHERE id = ` + itoa(queued)},
		{"negative attempt", `UPDATE relay_jobs SET attempt = -1 WHERE id = ` + itoa(queued)},
		{"empty queue", `UPDATE relay_jobs SET queue = '' WHERE id = ` + itoa(queued)},
		{"unique states without key", `UPDATE relay_jobs SET unique_states = '{queued}' WHERE id = ` + itoa(queued)},
	} {
		_, err := pool.Exec(ctx, c.sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
			t.Errorf("%s: got %v, want SQLSTATE 23514", c.name, err)
		}
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_jobs`); n != 3 {
		t.Errorf("%d rows after the refused inserts, want 3", n)
	}
	// A heartbeat-style renewal of a claimed job is fine.
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET lease_expires_at = now() + interval '2 minutes' WHERE id = $1`, claimed); err != nil {
		t.Errorf("lease renewal refused: %v", err)
	}
}

// ruleColumns returns the columns relay_jobs_broken_rules reads.
func ruleColumns(t *testing.T, pool *pgxpool.Pool) map[string]bool {
	t.Helper()
	var body string
	if err := pool.QueryRow(context.Background(), `SELECT prosrc FROM pg_proc WHERE oid = 'relay_jobs_broken_rules(relay_jobs)'::regprocedure`).Scan(&body); err != nil {
		t.Fatal(err)
	}
	cols := map[string]bool{}
	for _, m := range regexp.MustCompile(`\bj\.(\w+)`).FindAllStringSubmatch(body, -1) {
		cols[m[1]] = true
	}
	if len(cols) < 10 {
		t.Fatalf("read %d columns from relay_jobs_broken_rules, want its every column: %s", len(cols), body)
	}
	return cols
}

// trigger is a relay_jobs trigger as the catalog holds it.
type trigger struct {
	when    string          // its WHEN clause, lower case ("" if none)
	columns map[string]bool // its UPDATE OF columns
	body    string          // its function's source
}

func readTrigger(t *testing.T, pool *pgxpool.Pool, name string) trigger {
	t.Helper()
	var when, body string
	var cols []string
	err := pool.QueryRow(context.Background(), `
		SELECT coalesce(lower(substring(pg_get_triggerdef(tg.oid) FROM ' WHEN (.*) EXECUTE ')), ''),
		       ARRAY(SELECT a.attname::text FROM pg_attribute AS a
		             WHERE a.attrelid = tg.tgrelid AND a.attnum = ANY (tg.tgattr::int2[])),
		       p.prosrc
		FROM pg_trigger AS tg JOIN pg_proc AS p ON p.oid = tg.tgfoid
		WHERE tg.tgrelid = 'relay_jobs'::regclass AND tg.tgname = $1`, name).Scan(&when, &cols, &body)
	if err != nil {
		t.Fatalf("read trigger %s: %v", name, err)
	}
	tr := trigger{when: when, columns: map[string]bool{}, body: strings.ToLower(body)}
	for _, c := range cols {
		tr.columns[c] = true
	}
	return tr
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// The row rules refuse infinite timestamps on insert and on update.
func TestRowRulesRefuseInfiniteTimestamps(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	for _, col := range []string{"run_at", "created_at"} {
		for _, v := range []string{"infinity", "-infinity"} {
			_, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, `+col+`) VALUES ('x', '`+v+`')`)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" || !strings.Contains(pgErr.Message, "finite") {
				t.Fatalf("insert %s = %s: %v", col, v, err)
			}
		}
	}
	res, err := core.Enqueue(ctx, pool, echoArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, col := range []string{"run_at", "created_at", "attempted_at"} {
		_, err := pool.Exec(ctx, `UPDATE relay_jobs SET `+col+` = '-infinity' WHERE id = $1`, res.ID)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
			t.Fatalf("update %s: %v", col, err)
		}
	}
}

// The insert check is a row trigger whose function tests the rules'
// condition before it names the broken rule (migration
// *_rules_cheap_per_statement): every column relay_jobs_broken_rules reads
// must be in that condition, or a rule over it would go unchecked on
// insert; and each rule still refuses an insert, alone and as one bad row
// in a batch, with its error.
func TestInsertCheckNamesEveryRuleColumn(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	check := readTrigger(t, pool, "relay_jobs_insert_check")
	cond := check.body[:strings.Index(check.body, "then")]
	for col := range ruleColumns(t, pool) {
		if !regexp.MustCompile(`\bnew\.` + col + `\b`).MatchString(cond) {
			t.Errorf("relay_jobs_broken_rules reads %s, but the condition of relay_jobs_insert_check never reads new.%s:\n%s", col, col, cond)
		}
	}
	for _, c := range []struct{ name, values, code, msg string }{
		{"claimed", `state, lease_token, lease_expires_at) VALUES ('k', 'claimed', gen_random_uuid(), now())`, "RLY01", "inserted queued"},
		{"claimed for a second attempt", `state, attempt, attempted_at, lease_token, lease_expires_at) VALUES ('k', 'claimed', 2, now(), gen_random_uuid(), now())`, "RLY01", "inserted queued"},
		{"claimed never attempted", `state, attempt, lease_token, lease_expires_at) VALUES ('k', 'claimed', 1, gen_random_uuid(), now())`, "RLY01", "inserted queued"},
		{"claimed with an ordering key", `state, attempt, attempted_at, lease_token, lease_expires_at, ordering_key) VALUES ('k', 'claimed', 1, now(), gen_random_uuid(), now(), 'o')`, "RLY01", "inserted queued"},
		{"claimed without a lease", `state, attempt, attempted_at, lease_token) VALUES ('k', 'claimed', 1, now(), gen_random_uuid())`, "23514", "lease"},
		{"claimed with finalized_at", `state, attempt, attempted_at, lease_token, lease_expires_at, finalized_at) VALUES ('k', 'claimed', 1, now(), gen_random_uuid(), now(), now())`, "23514", "finalized_at"},
		{"unknown state", `state) VALUES ('k', 'running')`, "RLY01", "inserted queued"},
		{"long kind", `state) VALUES (repeat('k', 256), 'queued')`, "23514", "kind must be"},
		{"empty queue", `queue) VALUES ('k', '')`, "23514", "queue must be"},
		{"negative priority", `priority) VALUES ('k', -1)`, "23514", "priority must be"},
		{"negative attempt", `attempt) VALUES ('k', -1)`, "23514", "attempt must be"},
		{"no attempts", `max_attempts) VALUES ('k', 0)`, "23514", "max_attempts must be"},
		{"queued with a lease", `lease_token, lease_expires_at) VALUES ('k', gen_random_uuid(), now())`, "23514", "lease"},
		{"queued with finalized_at", `finalized_at) VALUES ('k', now())`, "23514", "finalized_at"},
		{"unique states without key", `unique_states) VALUES ('k', '{queued}')`, "23514", "unique_key"},
		{"long ordering key", `ordering_key) VALUES ('k', repeat('o', 501))`, "23514", "ordering_key"},
		{"33 tags", `tags) VALUES ('k', array_fill('t'::text, ARRAY[33]))`, "23514", "tags"},
		{"a null tag", `tags) VALUES ('k', '{t,NULL}')`, "23514", "tags"},
		{"infinite attempted_at", `attempted_at) VALUES ('k', '-infinity')`, "23514", "finite"},
		{"infinite lease expiry", `lease_expires_at) VALUES ('k', 'infinity')`, "23514", "finite"},
	} {
		for _, sql := range []string{
			`INSERT INTO relay_jobs (kind, ` + c.values,
			// The same row after 99 good ones, in one statement.
			`WITH bad AS (INSERT INTO relay_jobs (kind, ` + c.values + ` RETURNING 1)
			 INSERT INTO relay_jobs (kind) SELECT 'good' FROM generate_series(1, 99)`,
		} {
			_, err := pool.Exec(ctx, sql)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != c.code || !strings.Contains(pgErr.Message, c.msg) {
				t.Errorf("%s: got %v, want SQLSTATE %s mentioning %q", c.name, err, c.code, c.msg)
			}
		}
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_jobs`); n != 0 {
		t.Errorf("%d rows after the refused inserts, want 0", n)
	}
	// A first attempt inserted claimed, as a claim leaves it, is taken.
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, state, attempt, attempted_at, attempted_by, lease_token, lease_expires_at)
		VALUES ('k', 'claimed', 1, now(), 'w', gen_random_uuid(), now() + interval '1 minute')`); err != nil {
		t.Errorf("a job inserted claimed for its first attempt: %v", err)
	}
	// A lease token alone breaks no rule of a queued row: taken, as before.
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, lease_token) VALUES ('k', gen_random_uuid())`); err != nil {
		t.Errorf("a queued row with a token and no expiry: %v", err)
	}
}

// The state machine's two triggers test the rules in their WHEN clauses
// and call the function only for a write it may refuse (migration
// *_rules_cheap_per_statement). Every column relay_jobs_broken_rules reads
// is in the UPDATE OF list of one of them, or an update of it alone would
// fire neither; relay_jobs_state_machine's clause tests each rule over its
// columns on NEW, and relay_jobs_cold_rules' clause asks whether any of its
// columns changed (new.col and old.col).
func TestStateMachineNamesEveryRuleColumn(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	hot := readTrigger(t, pool, "relay_jobs_state_machine")
	cold := readTrigger(t, pool, "relay_jobs_cold_rules")
	reads := func(clause, ref string) bool { return regexp.MustCompile(`\b` + ref + `\b`).MatchString(clause) }
	for col := range ruleColumns(t, pool) {
		switch {
		case hot.columns[col]:
			if !reads(hot.when, "new."+col) {
				t.Errorf("relay_jobs_broken_rules reads %s, in relay_jobs_state_machine's columns, but its WHEN never reads new.%s:\n%s", col, col, hot.when)
			}
		case cold.columns[col]:
			if !reads(cold.when, "new."+col) || !reads(cold.when, "old."+col) {
				t.Errorf("relay_jobs_broken_rules reads %s, in relay_jobs_cold_rules' columns, but its WHEN does not compare new.%s with old.%s:\n%s", col, col, col, cold.when)
			}
		default:
			t.Errorf("relay_jobs_broken_rules reads %s, in neither state-machine trigger's UPDATE OF columns", col)
		}
	}
	// Both triggers call the one check.
	if hot.body != cold.body {
		t.Errorf("relay_jobs_state_machine and relay_jobs_cold_rules call different functions")
	}

	// Each rule over a column no claim or outcome writes still refuses an
	// update of that column, with 23514.
	id := int64(0)
	if err := pool.QueryRow(ctx, `INSERT INTO relay_jobs (kind) VALUES ('rules') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, set string }{
		{"empty kind", `kind = ''`},
		{"negative priority", `priority = -1`},
		{"no attempts", `max_attempts = 0`},
		{"empty ordering key", `ordering_key = ''`},
		{"unique key without states", `unique_key = 'u'`},
		{"an empty tag", `tags = '{""}'`},
		{"infinite run_at", `run_at = 'infinity'`},
	} {
		_, err := pool.Exec(ctx, `UPDATE relay_jobs SET `+c.set+` WHERE id = $1`, id)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
			t.Errorf("%s: got %v, want SQLSTATE 23514", c.name, err)
		}
	}

	// A succeeded job's state set to NULL is an illegal transition (RLY01),
	// as it was before the clause was split, not only a NOT NULL violation.
	var done int64
	if err := pool.QueryRow(ctx, `INSERT INTO relay_jobs (kind) VALUES ('done') RETURNING id`).Scan(&done); err != nil {
		t.Fatal(err)
	}
	for _, set := range []string{
		`state = 'claimed', attempt = 1, lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute'`,
		`state = 'succeeded', lease_token = NULL, lease_expires_at = NULL, finalized_at = now()`,
	} {
		if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET `+set+` WHERE id = $1`, done); err != nil {
			t.Fatal(err)
		}
	}
	_, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = NULL WHERE id = $1`, done)
	var nullErr *pgconn.PgError
	if !errors.As(err, &nullErr) || nullErr.Code != "RLY01" {
		t.Errorf("state = NULL: got %v, want SQLSTATE RLY01", err)
	}

	// A row written while the triggers were off may break rules. An update
	// that breaks nothing new is taken: a claim of a job with an empty
	// kind, and the fix of one of two broken rules (a negative attempt, of a
	// row whose tags break a later rule; before *_rules_cheap_per_statement
	// the first broken rule changed, and it was refused). One that breaks a
	// rule the row did not break is refused, on a hot column (finalized_at)
	// and on a cold one (priority), naming that rule.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var legacy, both int64
	if _, err := tx.Exec(ctx, `ALTER TABLE relay_jobs DISABLE TRIGGER USER`); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `INSERT INTO relay_jobs (kind) VALUES ('') RETURNING id`).Scan(&legacy); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `INSERT INTO relay_jobs (kind, attempt, tags) VALUES ('k', -1, '{""}') RETURNING id`).Scan(&both); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `ALTER TABLE relay_jobs ENABLE TRIGGER USER`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'claimed', attempt = 1, lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute' WHERE id = $1`, legacy); err != nil {
		t.Errorf("claim of a row that already broke a rule, breaking nothing new: %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET attempt = 0 WHERE id = $1`, both); err != nil {
		t.Errorf("fixing one of a row's two broken rules: %v", err)
	}
	for _, c := range []struct{ set, rule string }{
		{`finalized_at = now()`, "finalized_at"},
		{`priority = -1`, "priority"},
	} {
		_, err = pool.Exec(ctx, `UPDATE relay_jobs SET `+c.set+` WHERE id = $1`, both)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" || !strings.Contains(pgErr.Message, c.rule) {
			t.Errorf("%s on a row that already broke another rule: got %v, want SQLSTATE 23514 naming %s", c.set, err, c.rule)
		}
	}
}
