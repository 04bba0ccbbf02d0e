package core

import (
	"context"
	"strings"
	"testing"

	"github.com/relayq/relay/internal/testdb"
)

// The claim reads the partial claim index only: with 100,000 finished rows
// in the table, claiming touches a handful of buffers, not the finished rows.
func TestClaimIgnoresFinishedRows(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'old' FROM generate_series(1, 100000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'claimed', lease_token = gen_random_uuid(), lease_expires_at = now()`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'succeeded', lease_token = NULL, lease_expires_at = NULL, finalized_at = now()`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'new' FROM generate_series(1, 10)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE relay_jobs`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) "+sqlClaim, "default", 10, 30000, "explain")
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		rows.Scan(&line)
		plan = append(plan, line)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "relay_jobs_claim_idx") {
		t.Fatalf("claim does not use the claim index:\n%s", text)
	}
	if strings.Contains(text, "Seq Scan") {
		t.Fatalf("claim scans the table:\n%s", text)
	}
	// The index scan returned just the 10 queued rows.
	for _, l := range plan {
		if strings.Contains(l, "relay_jobs_claim_idx") && !strings.Contains(l, "rows=10 ") {
			t.Fatalf("index scan read more than the runnable rows: %s\n%s", l, text)
		}
	}
}
