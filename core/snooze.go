package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/internal/dbx"
)

// snoozeError asks for the job to run again after a delay without spending
// an attempt.
type snoozeError struct{ delay time.Duration }

func (e *snoozeError) Error() string { return fmt.Sprintf("snoozed for %s", e.delay) }

// Snooze, returned from Work, puts the job back in its queue to run again
// after d, and does NOT count the attempt: it is not a failure, and nothing
// is added to the job's history. Use it for a handler that has nothing to do
// yet (the workflow layer's sleeps, waits and step retries). Like every
// write about an attempt it is fenced by the lease token: a late worker's
// snooze changes nothing. A job woken by Wake while it ran is runnable at
// once rather than after d. A negative d is 0.
func Snooze(d time.Duration) error {
	if d < 0 {
		d = 0
	}
	return &snoozeError{delay: d}
}

// IsPermanent reports whether err was wrapped by Permanent.
func IsPermanent(err error) bool {
	var perm *permanentError
	return errors.As(err, &perm)
}

// RetryInDelay returns the delay asked for by a RetryIn error in err's chain.
func RetryInDelay(err error) (time.Duration, bool) {
	var rin *retryInError
	if errors.As(err, &rin) {
		return rin.delay, true
	}
	return 0, false
}

// sqlSnooze requeues attempt ($1 id, $2 token) after $3 microseconds,
// uncounting it. A job woken (by Wake) during the attempt has run_at later
// than its claim (attempted_at): it is then due at once, so a wake that
// arrives while the handler decides to snooze is not lost. RETURNING says
// whether the job is due now.
const sqlSnooze = `
UPDATE relay_jobs
SET state            = 'queued',
    attempt          = greatest(attempt - 1, 0),
    run_at           = CASE WHEN run_at > attempted_at
                            THEN least(run_at, now() + $3 * interval '1 microsecond')
                            ELSE now() + $3 * interval '1 microsecond' END,
    lease_token      = NULL,
    lease_expires_at = NULL
WHERE id = $1 AND lease_token = $2
RETURNING run_at <= now()`

// snooze records a snoozed attempt. It reports whether the job is runnable
// now (woken meanwhile, or a zero delay) and whether it was recorded.
func (c *Client) snooze(row *JobRow, d time.Duration) (due, ok bool) {
	ctx, cancel := c.dbCtx()
	defer cancel()
	err := dbx.PGX{Q: c.own}.Query(ctx, sqlSnooze, []any{row.ID, row.LeaseToken, d.Microseconds()}, func(r dbx.Scanner) error {
		ok = true
		return r.Scan(&due)
	})
	switch {
	case err != nil:
		c.logger.Error("relay: could not record a snoozed attempt; the lease will expire and the job will be rescued", jobLogAttrs(row, "error", err)...)
	case !ok:
		c.stats.leaseLost.Add(1)
		c.metrics.leaseLost.Add(ctx, 1, c.metrics.with(row))
		c.logger.Warn("relay: snooze not recorded: lease lost", jobLogAttrs(row)...)
	}
	return due, ok
}

// sqlHoldLease locks the row of attempt ($1 id, $2 token) FOR SHARE, if the
// attempt still holds the job: the rescuer, a cancel and every other write
// of the job wait until the caller's transaction ends, so whatever the
// transaction commits is committed while the lease was the attempt's.
const sqlHoldLease = `SELECT 1 FROM relay_jobs WHERE id = $1 AND lease_token = $2::uuid FOR SHARE`

// HoldLease checks, in the caller's transaction tx, that the attempt of row
// still holds the job's lease, and keeps it held until tx ends: the job's
// row is locked FOR SHARE, so no rescue, cancel or other attempt can take
// the job before tx commits or rolls back. It returns ErrLeaseLost when the
// lease is gone; roll tx back then. Call it last before the commit: the
// lock also holds up the job's heartbeat.
//
// It is the fence of writes other than the job's own outcome (the workflow
// layer's checkpoints): they commit only if the attempt that made them
// still owned the job.
func HoldLease(ctx context.Context, tx DB, row *JobRow) error {
	ex, err := execerFor(tx)
	if err != nil {
		return err
	}
	held := false
	if err := ex.Query(ctx, sqlHoldLease, []any{row.ID, row.LeaseToken.String()}, func(dbx.Scanner) error { held = true; return nil }); err != nil {
		return fmt.Errorf("core: hold lease of job %d: %w", row.ID, err)
	}
	if !held {
		return fmt.Errorf("core: hold lease of job %d: %w", row.ID, ErrLeaseLost)
	}
	return nil
}

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

func isSnooze(err error) bool {
	var sz *snoozeError
	return errors.As(err, &sz)
}

// snoozed records an attempt that returned Snooze (see executeOne). A job
// due at once is claimed again without waiting for the poll.
func (q *queue) snoozed(row *JobRow, span trace.Span, err error) {
	var sz *snoozeError
	errors.As(err, &sz)
	due, _ := q.client.snooze(row, sz.delay)
	if span.IsRecording() {
		span.AddEvent("snoozed", trace.WithAttributes(attribute.String("relay.job.snooze", sz.delay.String())))
	}
	span.End()
	if due {
		q.rescan.Store(true)
		q.notify()
	}
}

// LeaseCheck is HoldLease as a statement, for a batch or pipeline sent in
// one round trip (pgx.Batch runs in one implicit transaction): run with its
// args, it locks the job's row FOR SHARE while row's attempt holds the
// lease, and fails otherwise (IsLeaseLost reports that failure), aborting
// the transaction so that nothing else of it commits.
//
// The lock is taken by the statement itself; relay_hold_lease, which raises
// the failure, is called only when no row was locked (a PL/pgSQL call for
// every check cost as much PostgreSQL time as the lock).
func LeaseCheck(row *JobRow) (sql string, args []any) {
	return sqlLeaseCheck, []any{row.ID, row.LeaseToken.String()}
}

const sqlLeaseCheck = `
SELECT CASE WHEN held.n = 0 THEN relay_hold_lease($1, $2::uuid) END
FROM (SELECT count(*) AS n FROM (
    SELECT 1 FROM relay_jobs WHERE id = $1 AND lease_token = $2::uuid FOR SHARE) AS l) AS held`

// IsLeaseLost reports whether err is ErrLeaseLost or the failure of a
// LeaseCheck statement.
func IsLeaseLost(err error) bool {
	if errors.Is(err, ErrLeaseLost) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "RLY02"
}
