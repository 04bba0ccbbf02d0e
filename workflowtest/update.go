package workflowtest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/workflow"
)

// SentUpdate is an update request UpdateAt sends at a virtual time: read
// its answer with UpdateAnswer once the environment has driven the run
// (Wait, Run, Settle, AdvanceBy).
type SentUpdate struct {
	env   *Env
	at    time.Time
	runID string
	name  string
	id    int64 // the update's id (workflow.SendUpdate's), 0 until sent; under env.mu
}

// UpdateAt sends the update request name with req to run id
// (workflow.SendUpdate) when the virtual clock reaches at (at once if it
// has): the environment's clock stops there as at a timer, as for
// SignalAt. It does not wait for the answer (the run answers while the
// environment drives it); UpdateAnswer reads it. A send the engine refuses
// (a finished or unknown run, a request too large) fails the test.
func (e *Env) UpdateAt(at time.Time, id, name string, req any) *SentUpdate {
	u := &SentUpdate{env: e, at: at, runID: id, name: name}
	e.At(at, fmt.Sprintf("update %q to run %s", name, id), func(ctx context.Context, pool *pgxpool.Pool) error {
		uid, err := workflow.SendUpdate(ctx, pool, id, name, req)
		if err != nil {
			return err
		}
		e.mu.Lock()
		u.id = uid
		e.mu.Unlock()
		return nil
	})
	return u
}

// UpdateAfter is UpdateAt d after the virtual clock's present.
func (e *Env) UpdateAfter(d time.Duration, id, name string, req any) *SentUpdate {
	return e.UpdateAt(e.Now().Add(d), id, name, req)
}

// UpdateAnswer is the run's answer to u (workflow.UpdateResult's): the
// handler's response decoded into Resp, or an *workflow.UpdateError when
// the run rejected the request (workflow.ErrUpdateRejected) or its
// handler failed (workflow.ErrUpdateFailed), or workflow.ErrUpdateNotHandled
// when the run ended without handling it. It does not drive the
// environment: it fails the test when the clock has not reached u's time
// yet, or when the run is in flight and has not answered (drive it first:
// Wait, Settle, AdvanceBy).
func UpdateAnswer[Resp any](u *SentUpdate) (Resp, error) {
	e := u.env
	e.t.Helper()
	var zero Resp
	e.mu.Lock()
	uid := u.id
	e.mu.Unlock()
	if uid == 0 {
		e.t.Fatalf("workflowtest: update %q to run %s is not sent yet: it is due at %s, the virtual clock is at %s",
			u.name, u.runID, u.at.Format(time.RFC3339), e.Now().Format(time.RFC3339))
		return zero, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	var state string
	var finished bool
	err := e.pool.QueryRow(ctx, `
SELECT u.state, r.finished_at IS NOT NULL
FROM relay_workflow_updates u JOIN relay_workflow_runs r ON r.id = u.run_id
WHERE u.id = $1`, uid).Scan(&state, &finished)
	if err != nil {
		e.t.Fatalf("workflowtest: read update %q (%d) of run %s: %v", u.name, uid, u.runID, err)
		return zero, nil
	}
	if state == "pending" && !finished {
		e.t.Fatalf("workflowtest: update %q (%d) of run %s is not answered yet (virtual clock at %s): drive the run first (Wait, Settle, AdvanceBy)%s",
			u.name, uid, u.runID, e.Now().Format(time.RFC3339), e.blocked())
		return zero, nil
	}
	// Answered, or its run finished: UpdateResult returns at its first read.
	return workflow.UpdateResult[Resp](ctx, e.pool, nil, uid) // no listener: one read
}
