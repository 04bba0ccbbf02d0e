package fence

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Both fence statements probe the job table's primary key, beside
// thousands of jobs, as the core's own fenced statements do.
func TestFenceProbesThePrimaryKey(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'bulk' FROM generate_series(1, 20000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE relay_jobs`); err != nil {
		t.Fatal(err)
	}
	checkSQL, checkArgs := Check(1, uuid.New())
	for name, st := range map[string]struct {
		sql  string
		args []any
	}{
		"hold":  {sqlHold, []any{int64(1), uuid.New().String()}},
		"check": {checkSQL, checkArgs},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// EXPLAIN without ANALYZE: the check raises when no row is locked.
		rows, err := tx.Query(ctx, "EXPLAIN "+st.sql, st.args...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		tx.Rollback(ctx)
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		if !strings.Contains(plan, "relay_jobs_pkey") || strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s does not probe the primary key:\n%s", name, plan)
		}
	}
}
