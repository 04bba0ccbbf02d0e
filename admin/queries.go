package admin

import (
	"fmt"
	"strings"
	"time"
)

// The admin API's own SQL. Changes to jobs go through core (Cancel, Requeue,
// PauseQueue, ...), which keeps the state machine and the lease fence; what
// is here reads, or makes the few changes core has no call for (retry now,
// delete a finished job, redispatch an outbox event, delete an idempotency
// key, the audit row). Every value is a parameter; the only SQL assembled
// at run time is a WHERE clause from the fixed conditions of jobFilter.

const jobColumns = `id, kind, queue, state, priority, attempt, max_attempts, run_at, created_at,
       attempted_at, coalesce(attempted_by, ''), finalized_at, coalesce(last_error, ''), coalesce(ordering_key, '')`

// jobFilter is a validated filter over jobs.
type jobFilter struct {
	States                          []string // any of
	Queue, Kind, OrderingKey        string
	CreatedAfter, CreatedBefore     *time.Time
	FinalizedAfter, FinalizedBefore *time.Time
}

// where renders the filter as AND-ed conditions, appending their values to
// args and numbering placeholders after the ones already there. Each
// condition is a fixed string; only the placeholder numbers vary.
func (f jobFilter) where(args *[]any) string {
	var conds []string
	add := func(cond string, v any) {
		*args = append(*args, v)
		conds = append(conds, fmt.Sprintf(cond, len(*args)))
	}
	if len(f.States) == 1 {
		add("state = $%d", f.States[0])
	} else if len(f.States) > 1 {
		add("state = ANY($%d::text[])", f.States)
	}
	if f.Queue != "" {
		add("queue = $%d", f.Queue)
	}
	if f.Kind != "" {
		add("kind = $%d", f.Kind)
	}
	if f.OrderingKey != "" {
		add("ordering_key = $%d", f.OrderingKey)
	}
	if f.CreatedAfter != nil {
		add("created_at >= $%d", *f.CreatedAfter)
	}
	if f.CreatedBefore != nil {
		add("created_at < $%d", *f.CreatedBefore)
	}
	if f.FinalizedAfter != nil {
		add("finalized_at >= $%d", *f.FinalizedAfter)
	}
	if f.FinalizedBefore != nil {
		add("finalized_at < $%d", *f.FinalizedBefore)
	}
	if len(conds) == 0 {
		return "true"
	}
	return strings.Join(conds, " AND ")
}

// sqlListJobsByFinalized lists jobs of one finished state newest first, after
// a (finalized_at, id) cursor: it walks relay_jobs_finalized_idx (state,
// finalized_at) backwards and stops at the page, however many finished rows
// the table holds (TestListDeadJobsUsesIndex).
func sqlListJobsByFinalized(f jobFilter, after *cursor, limit int) (string, []any) {
	var args []any
	w := f.where(&args)
	if after != nil {
		args = append(args, after.At, after.ID)
		w += fmt.Sprintf(" AND (finalized_at, id) < ($%d, $%d)", len(args)-1, len(args))
	}
	args = append(args, limit)
	return fmt.Sprintf(`SELECT %s FROM relay_jobs WHERE %s ORDER BY finalized_at DESC, id DESC LIMIT $%d`,
		jobColumns, w, len(args)), args
}

// sqlListJobsByID lists jobs newest first by id, after an id cursor.
func sqlListJobsByID(f jobFilter, after *cursor, limit int) (string, []any) {
	var args []any
	w := f.where(&args)
	if after != nil {
		args = append(args, after.ID)
		w += fmt.Sprintf(" AND id < $%d", len(args))
	}
	args = append(args, limit)
	return fmt.Sprintf(`SELECT %s FROM relay_jobs WHERE %s ORDER BY id DESC LIMIT $%d`,
		jobColumns, w, len(args)), args
}

// sqlBulkBatch picks the next batch of a bulk operation: ids below the last
// batch's smallest, newest first.
func sqlBulkBatch(f jobFilter, belowID int64, limit int) (string, []any) {
	var args []any
	w := f.where(&args)
	args = append(args, belowID, limit)
	return fmt.Sprintf(`SELECT id FROM relay_jobs WHERE %s AND id < $%d ORDER BY id DESC LIMIT $%d`,
		w, len(args)-1, len(args)), args
}

// sqlBulkCount counts a bulk operation's jobs, up to a cap.
func sqlBulkCount(f jobFilter, max int) (string, []any) {
	var args []any
	w := f.where(&args)
	args = append(args, max)
	return fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM relay_jobs WHERE %s LIMIT $%d) AS matched`, w, len(args)), args
}

// sqlJobTraceparent reads a job's W3C trace context from its metadata.
const sqlJobTraceparent = `SELECT coalesce(metadata->>'traceparent', '') FROM relay_jobs WHERE id = $1`

// sqlRetryNow makes a job queued for later runnable now.
const sqlRetryNow = `
UPDATE relay_jobs SET run_at = now()
WHERE id = $1 AND state = 'queued' AND run_at > now()
RETURNING queue`

// sqlNotifyQueue wakes the workers of queue $1 (as core does).
const sqlNotifyQueue = `SELECT pg_notify('relay_jobs', $1::text)`

// sqlDeleteFinished deletes finished jobs among the ids $1.
const sqlDeleteFinished = `
DELETE FROM relay_jobs WHERE id = ANY($1::bigint[]) AND state IN ('succeeded', 'dead', 'cancelled')`

// sqlBulkDeleteFinished deletes the jobs among the ids $1 still in one of
// the finished states $2 that no other transaction holds, skipping the held
// ones instead of waiting for them.
const sqlBulkDeleteFinished = `
DELETE FROM relay_jobs WHERE id IN (
    SELECT id FROM relay_jobs
    WHERE id = ANY($1::bigint[]) AND state = ANY($2::text[]) AND state IN ('succeeded', 'dead', 'cancelled')
    FOR UPDATE SKIP LOCKED)`

// sqlSetLockTimeout bounds the lock waits of the rest of the transaction
// ($1 milliseconds).
const sqlSetLockTimeout = `SELECT set_config('lock_timeout', $1, true)`

const sqlJobStateOf = `SELECT state FROM relay_jobs WHERE id = $1`

// sqlLockJobState holds a job's row for the rest of the transaction and
// reads its state.
const sqlLockJobState = `SELECT state FROM relay_jobs WHERE id = $1 FOR UPDATE`

// sqlQueueStats reports every queue with work, recent finishes or a pause.
// Each part reads one partial index: queued rows (relay_jobs_claim_idx),
// claimed rows (relay_jobs_lease_idx), finishes of the last $1 minutes
// (relay_jobs_finalized_idx); finished rows older than the window cost
// nothing. $2 names one queue, or ” for all.
const sqlQueueStats = `
WITH queued AS (
    SELECT queue,
           count(*) FILTER (WHERE run_at <= now()) AS runnable,
           count(*) FILTER (WHERE run_at > now())  AS scheduled,
           min(run_at) FILTER (WHERE run_at <= now()) AS oldest
    FROM relay_jobs WHERE state = 'queued' AND ($2 = '' OR queue = $2) GROUP BY queue
), running AS (
    SELECT queue, count(*) AS running
    FROM relay_jobs WHERE state = 'claimed' AND ($2 = '' OR queue = $2) GROUP BY queue
), done AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE state = 'dead')      AS failed
    FROM relay_jobs
    WHERE state IN ('succeeded', 'dead') AND finalized_at > now() - $1 * interval '1 minute'
      AND ($2 = '' OR queue = $2)
    GROUP BY queue
), dead AS (
    SELECT queue, count(*) AS dead
    FROM relay_jobs WHERE state = 'dead' AND ($2 = '' OR queue = $2) GROUP BY queue
), names AS (
    SELECT queue FROM queued UNION SELECT queue FROM running UNION SELECT queue FROM done
    UNION SELECT queue FROM dead
    UNION SELECT queue FROM relay_queue_pauses WHERE ($2 = '' OR queue = $2)
)
SELECT n.queue, coalesce(q.runnable, 0), coalesce(q.scheduled, 0), coalesce(r.running, 0),
       coalesce(extract(epoch FROM now() - q.oldest), 0)::float8,
       coalesce(d.succeeded, 0), coalesce(d.failed, 0), coalesce(x.dead, 0),
       p.paused_at, coalesce(p.paused_by, '')
FROM names AS n
LEFT JOIN queued AS q USING (queue)
LEFT JOIN running AS r USING (queue)
LEFT JOIN done AS d USING (queue)
LEFT JOIN dead AS x USING (queue)
LEFT JOIN relay_queue_pauses AS p USING (queue)
ORDER BY n.queue`

// sqlQueueMinutes counts finishes per queue and minute over the last $1
// minutes (the current one included), for charts.
const sqlQueueMinutes = `
SELECT queue, date_trunc('minute', finalized_at) AS minute,
       count(*) FILTER (WHERE state = 'succeeded'), count(*) FILTER (WHERE state = 'dead')
FROM relay_jobs
WHERE state IN ('succeeded', 'dead') AND finalized_at >= date_trunc('minute', now()) - ($1 - 1) * interval '1 minute'
  AND ($2 = '' OR queue = $2)
GROUP BY 1, 2 ORDER BY 1, 2`

// sqlScheduleFires lists a schedule's latest fires.
const sqlScheduleFires = `
SELECT fire_time, outcome, job_id, recorded_at FROM relay_schedule_fires
WHERE schedule = $1 ORDER BY fire_time DESC LIMIT $2`

// sqlListOutbox lists outbox events newest first after an id cursor; $1 is
// pending, dispatched, failed (set aside by the dispatcher: a dispatched_at
// with a failed_at) or empty (all). Pending events walk
// relay_outbox_pending_idx.
const sqlListOutbox = `
SELECT id, topic, coalesce(key, ''), payload::text, headers::text, published_at, dispatched_at, coalesce(jobs, 0),
       failed_at, coalesce(dispatch_error, '')
FROM relay_outbox
WHERE ($1 = '' OR ($1 = 'pending' AND dispatched_at IS NULL)
       OR ($1 = 'dispatched' AND dispatched_at IS NOT NULL AND failed_at IS NULL)
       OR ($1 = 'failed' AND failed_at IS NOT NULL))
  AND ($2 = '' OR topic = $2) AND ($3 = '' OR key = $3) AND id < $4
ORDER BY id DESC LIMIT $5`

// sqlRedispatch puts a dispatched (or failed) event back in the
// dispatcher's way.
const sqlRedispatch = `
UPDATE relay_outbox SET dispatched_at = NULL, jobs = NULL, failed_at = NULL, dispatch_error = NULL
WHERE id = $1 AND dispatched_at IS NOT NULL`

const sqlOutboxExists = `SELECT dispatched_at IS NULL FROM relay_outbox WHERE id = $1`

// sqlNotifyOutbox wakes the outbox dispatchers.
const sqlNotifyOutbox = `SELECT pg_notify('relay_outbox', '')`

const sqlGetIdempotencyKey = `
SELECT status, result::text, expires_at, created_at, updated_at, lease_expires_at
FROM relay_idempotency_keys WHERE scope = $1 AND key = $2`

const sqlDeleteIdempotencyKey = `DELETE FROM relay_idempotency_keys WHERE scope = $1 AND key = $2`

// sqlAudit records one admin write.
const sqlAudit = `
INSERT INTO relay_admin_audit (subject, action, target, rows_changed) VALUES ($1, $2, $3::jsonb, $4)`

// sqlListAudit lists the audit log newest first after an id cursor.
const sqlListAudit = `
SELECT id, at, subject, action, target::text, rows_changed FROM relay_admin_audit
WHERE ($1 = '' OR subject = $1) AND ($2 = '' OR action = $2) AND id < $3
ORDER BY id DESC LIMIT $4`
