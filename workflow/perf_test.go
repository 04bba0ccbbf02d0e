package workflow_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayq/relay/workflow"
)

// Start writes the run, its job and the link between them in one
// statement: the job is a core job as any enqueue's (queue, priority,
// attempts, trace context, queued), linked both ways, on a pool, in a
// pgx transaction and through database/sql; a start of an existing id
// writes no job, nor does a start of another workflow's id.
func TestStartWritesRunAndJobTogether(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "linked", func(wctx workflow.Context, s string) (string, error) { return s, nil })
	other := workflow.MustRegister(b.reg, "other", func(wctx workflow.Context, s string) (string, error) { return s, nil })
	sqldb := stdlib.OpenDBFromPool(b.pool)
	defer sqldb.Close()

	check := func(id, queue string, priority, maxAttempts int) {
		t.Helper()
		n := b.count(`SELECT count(*) FROM relay_workflow_runs AS r JOIN relay_jobs AS j ON j.id = r.job_id
			WHERE r.id = $1 AND r.state = 'pending' AND j.kind = $2 AND j.state = 'queued' AND j.args->>'run_id' = r.id
			  AND j.queue = $3 AND r.queue = $3 AND j.priority = $4 AND j.max_attempts = $5
			  AND j.metadata->>'traceparent' IS NOT DISTINCT FROM r.trace->>'traceparent'`,
			id, workflow.RunKind, queue, priority, maxAttempts)
		if n != 1 {
			t.Fatalf("run %s: not linked to one queued job of queue %s, priority %d, %d attempts", id, queue, priority, maxAttempts)
		}
		if n := b.count(`SELECT count(*) FROM relay_jobs WHERE args->>'run_id' = $1`, id); n != 1 {
			t.Fatalf("run %s: %d jobs", id, n)
		}
	}
	if _, err := workflow.Start(ctx, b.pool, wf, "a", &workflow.StartOpts{ID: "pool", Queue: "q1", Priority: 3, MaxAttempts: 4}); err != nil {
		t.Fatal(err)
	}
	check("pool", "q1", 3, 4+3)

	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := workflow.Start(ctx, tx, wf, "b", &workflow.StartOpts{ID: "pgx-tx"}); err != nil || h.Existing {
		t.Fatal(h, err)
	}
	// The same id again in the same transaction: the run exists.
	if h, err := workflow.Start(ctx, tx, wf, "c", &workflow.StartOpts{ID: "pgx-tx"}); err != nil || !h.Existing {
		t.Fatal(h, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	check("pgx-tx", "default", 0, workflow.DefaultMaxAttempts+3)

	if _, err := workflow.Start(ctx, sqldb, wf, "d", &workflow.StartOpts{ID: "sql-db", Priority: 1}); err != nil {
		t.Fatal(err)
	}
	check("sql-db", "default", 1, workflow.DefaultMaxAttempts+3)
	stx, err := sqldb.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := workflow.Start(ctx, stx, wf, "e", &workflow.StartOpts{ID: "sql-tx"}); err != nil {
		t.Fatal(err)
	}
	if err := stx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs WHERE args->>'run_id' = 'sql-tx'`); n != 0 {
		t.Fatalf("a rolled-back start left %d jobs", n)
	}

	if h, err := workflow.Start(ctx, b.pool, wf, "f", &workflow.StartOpts{ID: "pool"}); err != nil || !h.Existing {
		t.Fatal(h, err)
	}
	if _, err := workflow.Start(ctx, b.pool, other, "g", &workflow.StartOpts{ID: "pool"}); !errors.Is(err, workflow.ErrIDInUse) {
		t.Fatalf("want ErrIDInUse, got %v", err)
	}
	check("pool", "q1", 3, 4+3)
	if n := b.count(`SELECT count(*) FROM relay_jobs`); n != 3 {
		t.Fatalf("%d jobs for three runs", n)
	}

	// The jobs wake a client and their runs finish.
	b.start("default", "q1")
	for _, id := range []string{"pool", "pgx-tx", "sql-db"} {
		if _, err := result[string](t, b.pool, id); err != nil {
			t.Fatal(id, err)
		}
	}
}
