package core

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/relayq/relay/testkit/testdb"
)

// A claim statement, prepared while the table is young and small (never
// analyzed, as after a migration) and kept as a generic plan, finds the
// rows it picked by primary-key probes: a hash join over a sequential scan
// of relay_jobs, chosen for the small table, would stay in the prepared
// plan while the table grows and read all of it on every claim.
func TestPreparedClaimProbesThePrimaryKey(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	// The statistics must stay those of a table never analyzed.
	for _, sql := range []string{
		`ALTER TABLE relay_jobs SET (autovacuum_enabled = false)`,
		`INSERT INTO relay_jobs (kind) SELECT 'new' FROM generate_series(1, 5)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ name, sql, types, args string }{
		{"sqlClaim", sqlClaim, "text, int, bigint, text, uuid", "'default', 100, 30000, 'w', gen_random_uuid()"},
		{"sqlClaimSync", sqlClaimSync, "text, int, bigint, text, uuid", "'default', 100, 30000, 'w', gen_random_uuid()"},
		{"sqlClaimAfter", sqlClaimAfter, "text, int, bigint, text, uuid, smallint, timestamptz, bigint", "'default', 100, 30000, 'w', gen_random_uuid(), 0, '-infinity', 0"},
		{"walkClaimSQL(false, 100)", walkClaimSQL(false, 100), "text, int, bigint, text, uuid, smallint, timestamptz, bigint", "'default', 100, 30000, 'w', gen_random_uuid(), 0, '-infinity', 0"},
		{"walkClaimSQL(true, 1000)", walkClaimSQL(true, 1000), "text, int, bigint, text, uuid, smallint, timestamptz, bigint", "'default', 1000, 30000, 'w', gen_random_uuid(), 0, '-infinity', 0"},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for _, sql := range []string{
			`SET LOCAL plan_cache_mode = force_generic_plan`,
			`PREPARE generic_claim (` + c.types + `) AS ` + c.sql,
			`EXPLAIN EXECUTE generic_claim (` + c.args + `)`,
		} {
			rows, err := tx.Query(ctx, sql)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, line)
			}
			if rows.Err() != nil {
				t.Fatalf("%s: %v", c.name, rows.Err())
			}
		}
		if _, err := tx.Exec(ctx, `DEALLOCATE generic_claim`); err != nil {
			t.Fatal(err)
		}
		tx.Rollback(ctx)
		text := strings.Join(plan, "\n")
		if strings.Contains(text, "Seq Scan on relay_jobs") || !strings.Contains(text, "relay_jobs_pkey on relay_jobs j") {
			t.Errorf("%s's generic plan does not probe the primary key for the rows it updates:\n%s", c.name, text)
		}
	}
}

// The drain cursor's claim, prepared over a large queue, is planned once:
// after its first five calls PostgreSQL keeps the generic plan (a walk of
// the claim index and a primary-key probe per picked row), where the
// unbounded statement is planned again on every call; and a bounded claim
// takes exactly the jobs it asks for, however many more its bound holds.
func TestWalkClaimKeepsOnePlan(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'k' FROM generate_series(1, 20000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE relay_jobs`); err != nil {
		t.Fatal(err)
	}
	const types = "text, int, bigint, text, uuid, smallint, timestamptz, bigint"
	for _, c := range []struct {
		name, sql string
		limit     int
		generic   bool
	}{
		{"walkClaimSQL(false, 100)", walkClaimSQL(false, 100), 100, true},
		{"walkClaimSQL(false, 33)", walkClaimSQL(false, 33), 33, true},
		{"walkClaimSQL(true, 1)", walkClaimSQL(true, 1), 1, true},
		{"walkClaimSQL(false, 1000)", walkClaimSQL(false, 1000), 1000, true},
		{"sqlClaimAfter", sqlClaimAfter, 100, false},
	} {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		exec := func(sql string, args ...any) {
			t.Helper()
			if _, err := conn.Exec(ctx, sql, args...); err != nil {
				t.Fatalf("%s: %s: %v", c.name, sql, err)
			}
		}
		exec(`PREPARE walk (` + types + `) AS ` + c.sql)
		for range 8 {
			exec(`BEGIN`)
			n := 0
			rows, err := conn.Query(ctx, `EXECUTE walk ('default', `+strconv.Itoa(c.limit)+`, 30000, 'w', gen_random_uuid(), 0, '-infinity', 0)`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				n++
			}
			if rows.Err() != nil {
				t.Fatal(rows.Err())
			}
			if n != c.limit {
				t.Fatalf("%s claimed %d jobs, want %d", c.name, n, c.limit)
			}
			exec(`ROLLBACK`)
		}
		var generic, custom int
		if err := conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'walk'`).Scan(&generic, &custom); err != nil {
			t.Fatal(err)
		}
		if c.generic && (generic < 3 || custom > 5) {
			t.Errorf("%s: %d generic and %d custom plans in 8 calls: it is planned again on each call", c.name, generic, custom)
		}
		if !c.generic && generic != 0 {
			t.Logf("%s: %d generic plans (the unbounded claim was not expected to keep one)", c.name, generic)
		}
		if c.generic {
			var plan []string
			rows, err := conn.Query(ctx, `EXPLAIN EXECUTE walk ('default', `+strconv.Itoa(c.limit)+`, 30000, 'w', gen_random_uuid(), 0, '-infinity', 0)`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, line)
			}
			text := strings.Join(plan, "\n")
			if strings.Contains(text, "Seq Scan on relay_jobs") || !strings.Contains(text, "relay_jobs_pkey on relay_jobs j") || !strings.Contains(text, "relay_jobs_claim_idx") {
				t.Errorf("%s's kept plan does not walk the claim index and probe the primary key:\n%s", c.name, text)
			}
		}
		exec(`DEALLOCATE walk`)
		conn.Release()
	}
}
