package core

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/testkit/testdb"
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
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, FORMAT TEXT) "+sqlClaim, "default", 10, 30000, "explain", [16]byte(uuid.New()))
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
	// The index scan returned just the 10 queued rows (the probes for the
	// queue's priorities, "on relay_jobs p", one entry each).
	for _, l := range plan {
		if strings.Contains(l, "relay_jobs_claim_idx on relay_jobs c") && !strings.Contains(l, "rows=10 ") {
			t.Fatalf("index scan read more than the runnable rows: %s\n%s", l, text)
		}
		if strings.Contains(l, "relay_jobs_claim_idx on relay_jobs p") && !strings.Contains(l, "rows=1 ") && !strings.Contains(l, "rows=0 ") {
			t.Fatalf("a priority probe read more than one entry: %s\n%s", l, text)
		}
	}
}

// explain returns the plan of sql with args, run for real in a rolled-back
// transaction.
func explain(t *testing.T, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, sql string, args ...any) string {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, FORMAT TEXT) "+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range lines { // array parameters make lines very long
		if len(l) > 400 {
			lines[i] = l[:400] + "…"
		}
	}
	return strings.Join(lines, "\n")
}

// Writes fenced by a lease token find their rows through the primary key,
// even when the statistics say no job is claimed — the state right after a
// bulk insert and ANALYZE, when workers then claim thousands. Planned from
// the lease index or a join through unnest, each batch walked every claimed
// row (seconds per batch in a 50,000-job burn-down).
func TestFencedWritesProbeThePrimaryKey(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	// The statistics must stay those of the ANALYZE below: an autoanalyze
	// after the claim (on a server with autovacuum on) plans differently.
	if _, err := pool.Exec(ctx, `ALTER TABLE relay_jobs SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'bulk' FROM generate_series(1, 20000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE relay_jobs`); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, sqlClaim, "default", 20000, 30000, "w", [16]byte(uuid.New()))
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	var tokens []uuid.UUID
	for rows.Next() {
		var r [14]any
		ptrs := make([]any, 14)
		for i := range r {
			ptrs[i] = &r[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		if len(ids) < 2000 {
			ids = append(ids, r[0].(int64))
			tokens = append(tokens, uuid.UUID(r[11].([16]byte)))
		}
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	type stmt struct {
		sql  string
		args []any
		rows int
	}
	for name, st := range map[string]stmt{
		"complete many": {sqlCompleteMany, []any{ids, tokens}, len(ids)},
		"heartbeat":     {sqlHeartbeat, []any{ids, tokens, 30000}, len(ids)},
		"release":       {sqlReleaseMany, []any{ids, tokens}, len(ids)},
		"complete one":  {sqlCompleteOne, []any{ids[0], tokens[0].String()}, 1},
		"fail":          {sqlFailMany, []any{ids, tokens, repeat("queued", len(ids)), repeat(int64(0), len(ids)), repeat("boom", len(ids))}, len(ids)},
	} {
		plan := explain(t, pool, st.sql, st.args...)
		if !strings.Contains(plan, "relay_jobs_pkey") || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Nested Loop") {
			t.Errorf("%s does not probe the primary key:\n%s", name, plan)
		}
		if !strings.Contains(plan, fmt.Sprintf("rows=%d loops=1)", st.rows)) {
			t.Errorf("%s did not reach its %d rows:\n%s", name, st.rows, plan)
		}
	}
}

// The claim turns synchronous_commit off for its own transaction only.
func TestClaimCommitsAsynchronously(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) VALUES ('a')`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	show := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		var v string
		if err := q.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := show(tx); v != "on" {
		t.Fatalf("before the claim: synchronous_commit=%s", v)
	}
	rows, err := tx.Query(ctx, sqlClaim, "default", 10, 30000, "w", [16]byte(uuid.New()))
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if v := show(tx); v != "off" {
		t.Errorf("in the claim's transaction: synchronous_commit=%s, want off", v)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if v := show(conn); v != "on" {
		t.Errorf("after the claim's transaction: synchronous_commit=%s, want on", v)
	}
}

// The synchronous twins of the claim statements (Config.SynchronousClaims)
// leave synchronous_commit as the session has it (remote_write here), and
// the asynchronous ones turn it off.
func TestSynchronousClaimStatementsKeepTheSessionSetting(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET synchronous_commit = remote_write`); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `RESET synchronous_commit`) //nolint:errcheck
	token := [16]byte(uuid.New())
	for _, tc := range []struct {
		name, sql string
		args      []any
		want      string
	}{
		{"sqlClaim", sqlClaim, []any{"default", 10, 30000, "w", token}, "off"},
		{"sqlClaimSync", sqlClaimSync, []any{"default", 10, 30000, "w", token}, "remote_write"},
		{"sqlClaimAfter", sqlClaimAfter, []any{"default", 10, 30000, "w", token, int16(0), time.Now().Add(-time.Hour), int64(0)}, "off"},
		{"sqlClaimAfterSync", sqlClaimAfterSync, []any{"default", 10, 30000, "w", token, int16(0), time.Now().Add(-time.Hour), int64(0)}, "remote_write"},
		{"sqlLockLimits", sqlLockLimits, []any{"default"}, "off"},
		{"sqlLockLimitsSync", sqlLockLimitsSync, []any{"default"}, "remote_write"},
	} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A claim sets the commit mode only when it claims a job.
		if _, err := tx.Exec(ctx, `INSERT INTO relay_jobs (kind) VALUES ('a')`); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, tc.sql, tc.args...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var v string
		if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v != tc.want {
			t.Errorf("in %s's transaction: synchronous_commit=%s, want %s", tc.name, v, tc.want)
		}
		tx.Rollback(ctx) //nolint:errcheck
	}
}

// Batch fencing matches (id, token) pairs, not ids and tokens as two sets.
// One claim statement gives all its jobs one token, so job A re-claimed in
// the same claim as job B shares B's token: a late success of A's earlier
// attempt, batched with B's success, must not complete A's new attempt.
func TestFenceMatchesPairs(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	var a, b int64
	if err := pool.QueryRow(ctx, `INSERT INTO relay_jobs (kind) VALUES ('a') RETURNING id`).Scan(&a); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `INSERT INTO relay_jobs (kind) VALUES ('b') RETURNING id`).Scan(&b); err != nil {
		t.Fatal(err)
	}
	stale, current := uuid.New(), uuid.New()
	// A's attempt under the stale token ended (rescued); A and B were then
	// claimed together under the current one.
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'claimed', attempt = 1, lease_token = $1, lease_expires_at = now() + interval '1 minute'`, current); err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]struct {
		sql  string
		args []any
	}{
		"complete many": {sqlCompleteMany, []any{[]int64{a, b}, [][16]byte{stale, current}}},
		"heartbeat":     {sqlHeartbeat, []any{[]int64{a, b}, [][16]byte{stale, current}, 30000}},
		"release":       {sqlReleaseMany, []any{[]int64{a, b}, [][16]byte{stale, current}}},
		"fail":          {sqlFailMany, []any{[]int64{a, b}, [][16]byte{stale, current}, []string{"queued", "queued"}, []int64{0, 0}, []string{"x", "x"}}},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, st.sql, st.args...)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for rows.Next() {
			var id int64
			var written bool
			if err := rows.Scan(&id, &written); err != nil {
				t.Fatal(err)
			}
			if !written {
				t.Errorf("%s: job %d reported locked elsewhere", name, id)
			}
			got = append(got, id)
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		if len(got) != 1 || got[0] != b {
			t.Errorf("%s wrote jobs %v, want only %d (job %d's pair names a stale token)", name, got, b, a)
		}
		tx.Rollback(ctx)
	}
}

func repeat[T any](v T, n int) []T {
	s := make([]T, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// Each statement variant is its base statement with its named part, and
// only that part, changed: the builders cannot drift into two statements.
func TestStatementVariantsDifferOnlyInTheirParts(t *testing.T) {
	floorCursor := "\n           AND (priority, run_at, id) > ($2::smallint, $3::timestamptz, $4::bigint)"
	for _, c := range []struct {
		name, variant, base, old, new string
		n                             int
	}{
		{"sqlClaimSync", sqlClaimSync, sqlClaim, asyncCommit, sessionCommit, 1},
		{"sqlClaimAfterSync", sqlClaimAfterSync, sqlClaimAfter, asyncCommit, sessionCommit, 1},
		{"sqlLockLimitsSync", sqlLockLimitsSync, sqlLockLimits, asyncCommit, sessionCommit, 1},
		{"sqlClaimFromSync", sqlClaimFromSync, sqlClaimFrom, asyncCommit, sessionCommit, 1},
		{"sqlFloorProbeAfter", sqlFloorProbeAfter, sqlFloorProbe, "queue = $1\n", "queue = $1" + floorCursor + "\n", 2},
	} {
		if got := strings.Count(c.base, c.old); got != c.n {
			t.Errorf("%s: its base holds the part %q %d times, want %d", c.name, c.old, got, c.n)
			continue
		}
		if want := strings.ReplaceAll(c.base, c.old, c.new); c.variant != want {
			t.Errorf("%s differs from its base by more than its part:\n%s\nwant:\n%s", c.name, c.variant, want)
		}
	}
	// The fenced writes share their shape: everything but the SET list
	// (and sqlFailMany's inputs) is one text.
	for name, sql := range map[string]string{"sqlCompleteMany": sqlCompleteMany, "sqlFailMany": sqlFailMany, "sqlReleaseMany": sqlReleaseMany, "sqlHeartbeat": sqlHeartbeat} {
		for _, part := range []string{"FOR NO KEY UPDATE SKIP LOCKED", "WHERE j.id = ANY(ARRAY(SELECT id FROM locked))", "AND (SELECT count(*) FROM done) < cardinality($1::bigint[])"} {
			if strings.Count(sql, part) != 1 {
				t.Errorf("%s does not hold %q once", name, part)
			}
		}
	}
}
