package core

import (
	"context"
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
