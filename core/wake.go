package core

import (
	"context"
	"fmt"

	"github.com/relayq/relay/internal/dbx"
)

// sqlWake makes job $1 runnable now: a queued job waiting for its run_at
// is due at once; a claimed one gets a run_at later than its claim, which a
// Snooze of the running attempt honours. clock_timestamp, not now(): a wake
// whose transaction began before the attempt's claim still lands after it.
// A queued job already due is written too (run_at unchanged): the row lock
// makes claims (SKIP LOCKED) step over it until the waker's transaction
// ends, so no execution starts without the waker's writes in sight (a
// child's outcome; without it a parent claimed in that window suspended
// again and missed its wake-up: TestWakeHoldsADueJobUntilCommit).
const sqlWake = `
UPDATE relay_jobs
SET run_at = CASE WHEN state = 'claimed' OR run_at > clock_timestamp() THEN clock_timestamp() ELSE run_at END
WHERE id = $1 AND state IN ('claimed', 'queued')
RETURNING queue, state`

// Wake makes a job that waits (queued with a later run_at, or snoozing)
// runnable now, in db's transaction when db is one. A job running when it
// is woken, and that then snoozes, runs again at once. Final jobs and jobs
// already due are left alone. Wake takes the job row's lock until db's
// transaction ends.
func Wake(ctx context.Context, db DB, id int64) error {
	ex, err := execerFor(db)
	if err != nil {
		return err
	}
	var queue, state string
	if err := ex.Query(ctx, sqlWake, []any{id}, func(r dbx.Scanner) error { return r.Scan(&queue, &state) }); err != nil {
		return fmt.Errorf("core: wake job %d: %w", id, err)
	}
	if state == string(StateQueued) {
		if _, err := ex.Exec(ctx, sqlNotifyQueue, queue); err != nil {
			return fmt.Errorf("core: wake job %d: notify workers: %w", id, err)
		}
	}
	return nil
}
