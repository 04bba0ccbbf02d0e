package workflow

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/internal/fence"
	"github.com/relayq/relay/testkit/testdb"
)

// The checkpoint that ends a batch carries the batch's lease check and
// cancel read (sqlUpsertStepFenced): under another lease token it fails as
// fence.Check fails (RLY02), rolling back the batch's earlier statements
// with it; under the job's token it writes the step and returns the run's
// cancel flag.
func TestFencedCheckpointRefusesAnotherLease(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	token := uuid.New()
	for _, q := range []string{
		`SET session_replication_role = replica`, // rows written as a claim would leave them
		`INSERT INTO relay_jobs (id, kind, state, lease_token, lease_expires_at, attempt, attempted_at) OVERRIDING SYSTEM VALUE
		 VALUES (7, 'relay.workflow', 'claimed', '` + token.String() + `', now() + interval '1 hour', 1, now())`,
		`INSERT INTO relay_workflow_runs (id, workflow, input, queue, job_id, state, cancel_requested) VALUES ('r', 'w', '1', 'default', 7, 'running', true)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	step := func(pos int) []any {
		return (&stepWrite{row: &stepRow{position: pos, key: "k", kind: "step", state: stepCompleted, output: "1"}, attempts: 1, delay: -1}).args("r")
	}
	send := func(tok uuid.UUID) (cancel bool, err error) {
		b := &pgx.Batch{}
		b.Queue(sqlUpsertStep, step(0)...)
		b.Queue(sqlUpsertStepFenced, append(step(1), int64(7), tok.String())...)
		br := pool.SendBatch(ctx, b)
		_, err = br.Exec()
		var wakeAt any
		if e := br.QueryRow().Scan(&wakeAt, &cancel); err == nil {
			err = e
		}
		if e := br.Close(); err == nil {
			err = e
		}
		return cancel, err
	}
	if _, err := send(uuid.New()); !fence.IsLost(err) {
		t.Fatalf("another lease's checkpoint: %v, want the lease lost (RLY02)", err)
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'r'`); n != 0 {
		t.Fatalf("%d steps written under another lease, want 0 (the batch rolled back)", n)
	}
	cancel, err := send(token)
	if err != nil || !cancel {
		t.Fatalf("the lease's checkpoint: cancel %v, %v; want the run's flag (true) and no error", cancel, err)
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'r'`); n != 2 {
		t.Fatalf("%d steps written under the lease, want 2", n)
	}
}
