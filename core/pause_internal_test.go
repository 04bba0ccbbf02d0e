package core

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/testkit/testdb"
)

// TestClaimChecksPauseOnce: the claim's pause check is one primary-key probe
// per statement (an InitPlan gating the scan), not a probe per row, for
// both claim statements.
func TestClaimChecksPauseOnce(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'k' FROM generate_series(1, 100)`); err != nil {
		t.Fatal(err)
	}
	for name, sql := range map[string]string{"sqlClaim": sqlClaim, "sqlClaimAfter": sqlClaimAfter} {
		args := []any{"default", 10, 30000, "explain", [16]byte(uuid.New())}
		if name == "sqlClaimAfter" {
			args = append(args, 0, "-infinity", 0)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		tx.Rollback(ctx)
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		if !strings.Contains(plan, "relay_queue_pauses_pkey") || !strings.Contains(plan, "One-Time Filter") {
			t.Fatalf("%s: the pause check is not a one-time probe:\n%s", name, plan)
		}
	}
}
