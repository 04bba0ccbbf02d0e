package core

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/relayq/relay/testkit/testdb"
)

// Snooze and Wake probe the primary key, beside thousands of claimed jobs
// (internal/fence checks its statements the same way).
func TestSnoozeWakeHoldProbeThePrimaryKey(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'bulk' FROM generate_series(1, 20000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE relay_jobs`); err != nil {
		t.Fatal(err)
	}
	var id int64
	var token [16]byte
	if err := pool.QueryRow(ctx, sqlClaim, "default", 5000, 30000, "w", [16]byte(uuid.New())).Scan(
		&id, new(string), new(string), new(int16), new(int), new(int), new(any), new(any), new(any), new([]byte), new([]byte), &token, new(string), new([]string)); err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]struct {
		sql  string
		args []any
	}{
		"snooze": {sqlSnooze, []any{id, token, 0}},
		"wake":   {sqlWake, []any{id}},
	} {
		plan := explain(t, pool, st.sql, st.args...)
		if !strings.Contains(plan, "relay_jobs_pkey") || strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s does not probe the primary key:\n%s", name, plan)
		}
	}
}
