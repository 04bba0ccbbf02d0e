package core

import (
	"errors"
	"fmt"
	"time"

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

// sqlSnooze requeues attempt ($1 id, $2 token) after $3 microseconds,
// uncounting it. A job woken (by Wake) during the attempt has run_at later
// than its claim (attempted_at): it is then due at once, so a wake that
// arrives while the handler decides to snooze is not lost. RETURNING says
// whether the job is due now, by clock_timestamp(), not now(): a waker
// whose transaction held the row when this statement began set a run_at
// later than this statement's now(), and sent no notification (it saw the
// job claimed), so "not due" by now() would leave the woken job to the
// next poll.
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
RETURNING run_at <= clock_timestamp()`

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

func isSnooze(err error) bool {
	var sz *snoozeError
	return errors.As(err, &sz)
}

// snoozed records an attempt that returned Snooze (see executeOne). A job
// due at once is claimed again without waiting for the poll.
func (q *queue) snoozed(row *JobRow, span trace.Span, err error) {
	var sz *snoozeError
	errors.As(err, &sz)
	c := q.client
	// Its lease is renewed while the write waits (Client.heartbeat).
	if r := row.run; r != nil {
		c.snoozing.Store(r, struct{}{})
		defer c.snoozing.Delete(r)
	}
	due, _ := c.snooze(row, sz.delay)
	if span.IsRecording() {
		span.AddEvent("snoozed", trace.WithAttributes(attribute.String("relay.job.snooze", sz.delay.String())))
	}
	span.End()
	if due {
		q.rescan.Store(true)
		q.notify()
	}
}
