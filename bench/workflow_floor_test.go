package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/bench"
	"github.com/relayq/relay/testkit/testdb"
)

// The workflow floor does the work of a durable three-step run for every
// run it is given, and only that: each run's three checkpoints recorded
// once, its outcome once, its job's success once; and a run whose first
// checkpoint an earlier execution recorded is replayed, not run again (a
// second write of that position would break the steps' primary key). A
// floor that skipped or repeated writes would measure other work than
// Relay's.
func TestWorkflowFloorRecordsEachStepOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var sys bench.WorkflowFloor
	spec := bench.WorkflowSpec{Mode: "queued", Shape: bench.ShapeChain, URL: testdb.URL(t), Schema: "floor_wf", Workers: 20}
	eng, err := sys.Open(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	const batches, per, single = 3, 500, 100
	for range batches {
		if err := eng.(bench.BatchStarter).StartBatch(ctx, bench.ShapeChain, per); err != nil {
			t.Fatal(err)
		}
	}
	for range single {
		if err := eng.Enqueue(ctx, bench.ShapeChain); err != nil {
			t.Fatal(err)
		}
	}
	const n = batches*per + single
	pool := eng.Pool()
	// Ten runs had an execution that recorded their first step and died.
	if _, err := pool.Exec(ctx, `INSERT INTO floor_wf_steps (run_id, position, output) SELECT id, 0, '0' FROM floor_wf_runs WHERE id % 150 = 0`); err != nil {
		t.Fatal(err)
	}
	if err := eng.Serve(ctx); err != nil {
		t.Fatal(err)
	}
	for eng.Progress() < n {
		select {
		case <-ctx.Done():
			t.Fatalf("the floor finished %d of %d runs", eng.Progress(), n)
		case <-time.After(5 * time.Millisecond):
		}
	}
	// Every outcome committed before its execution counted it; the jobs'
	// successes follow within the completer's gathering.
	var jobsDone int64
	for jobsDone < n {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM floor_wf_jobs WHERE state = 2`).Scan(&jobsDone); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d jobs recorded succeeded", jobsDone, n)
		case <-time.After(5 * time.Millisecond):
		}
	}
	var runs, completed, threeSteps, steps, jobs, succeeded, leased int64
	err = pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM floor_wf_runs),
		       (SELECT count(*) FROM floor_wf_runs WHERE state = 1 AND output = '3' AND finished_at IS NOT NULL),
		       (SELECT count(*) FROM (SELECT run_id FROM floor_wf_steps GROUP BY run_id
		            HAVING count(*) = 3 AND array_agg(position ORDER BY position) = '{0,1,2}') s),
		       (SELECT count(*) FROM floor_wf_steps),
		       (SELECT count(*) FROM floor_wf_jobs),
		       (SELECT count(DISTINCT run_id) FROM floor_wf_jobs WHERE state = 2 AND finalized_at IS NOT NULL),
		       (SELECT count(*) FROM floor_wf_jobs WHERE lease_token IS NOT NULL)`).
		Scan(&runs, &completed, &threeSteps, &steps, &jobs, &succeeded, &leased)
	if err != nil {
		t.Fatal(err)
	}
	if runs != n || completed != n || threeSteps != n || steps != 3*n || jobs != n || succeeded != n || leased != 0 || eng.Progress() != n {
		t.Fatalf("runs %d, completed %d, with steps 0-2 %d, step rows %d, jobs %d, succeeded %d, still leased %d, executions finished %d; want %d, %d, %d, %d, %d, %d, 0, %d",
			runs, completed, threeSteps, steps, jobs, succeeded, leased, eng.Progress(), n, n, n, 3*n, n, n, n)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	var left bool
	if err := pgxConnectQuery(ctx, spec.URL, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = 'floor_wf')`, &left); err != nil {
		t.Fatal(err)
	}
	if left {
		t.Fatal("Close left the floor's schema")
	}
}

func pgxConnectQuery(ctx context.Context, url, sql string, dst any) error {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return c.QueryRow(ctx, sql).Scan(dst)
}
