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
       attempted_at, coalesce(attempted_by, ''), finalized_at, coalesce(last_error, ''), coalesce(ordering_key, ''),
       nullif(tags, '{}')`

// scannedColumns are the columns of the jobs a bounded list examines: what
// jobColumns and the filter's conditions read, and not the large ones
// (args, metadata, history).
const scannedColumns = `id, kind, queue, state, priority, attempt, max_attempts, run_at, created_at,
           attempted_at, attempted_by, finalized_at, last_error, ordering_key, tags`

// jobFilter is a validated filter over jobs.
type jobFilter struct {
	States                          []string // any of
	Queue, Kind, OrderingKey        string
	Tags                            []string // every one of
	CreatedAfter, CreatedBefore     *time.Time
	FinalizedAfter, FinalizedBefore *time.Time
}

// The parts of a filter where renders.
const (
	allConds     = iota
	indexedConds // the states and tags: what an index of relay_jobs finds
	otherConds   // the rest: checked row by row
)

// where renders the filter's conditions of one part as AND-ed SQL,
// appending their values to args and numbering placeholders after the
// ones already there. Each condition is a fixed string; only the
// placeholder numbers vary.
func (f jobFilter) where(args *[]any, part int) string {
	var conds []string
	add := func(p int, cond string, v any) {
		if part != allConds && part != p {
			return
		}
		*args = append(*args, v)
		conds = append(conds, fmt.Sprintf(cond, len(*args)))
	}
	if len(f.States) == 1 {
		add(indexedConds, "state = $%d", f.States[0])
	} else if len(f.States) > 1 {
		add(indexedConds, "state = ANY($%d::text[])", f.States)
	}
	if len(f.Tags) > 0 {
		// tags <> '{}' is relay_jobs_tags_idx's predicate: with it the
		// GIN index serves the containment.
		add(indexedConds, "tags <> '{}' AND tags @> $%d::text[]", f.Tags)
	}
	if f.Queue != "" {
		add(otherConds, "queue = $%d", f.Queue)
	}
	if f.Kind != "" {
		add(otherConds, "kind = $%d", f.Kind)
	}
	if f.OrderingKey != "" {
		add(otherConds, "ordering_key = $%d", f.OrderingKey)
	}
	if f.CreatedAfter != nil {
		add(otherConds, "created_at >= $%d", *f.CreatedAfter)
	}
	if f.CreatedBefore != nil {
		add(otherConds, "created_at < $%d", *f.CreatedBefore)
	}
	if f.FinalizedAfter != nil {
		add(otherConds, "finalized_at >= $%d", *f.FinalizedAfter)
	}
	if f.FinalizedBefore != nil {
		add(otherConds, "finalized_at < $%d", *f.FinalizedBefore)
	}
	if len(conds) == 0 {
		return "true"
	}
	return strings.Join(conds, " AND ")
}

// hasOther reports whether the filter has conditions no index serves.
func (f jobFilter) hasOther() bool {
	var args []any
	return f.where(&args, otherConds) != "true"
}

// listScanRows bounds the jobs one list request examines when its filter
// has conditions checked row by row (queue, kind, ordering key, time
// ranges): the page walks at most this many jobs of its order (those of
// the filter's states and tags) and stops there, even with fewer matches
// than asked for. Without the bound a filter that matches nothing walked
// every finished row: 100 ms a request beside a million of them.
const listScanRows = 10000

// sqlListJobsByFinalized lists jobs of one finished state newest first, after
// a (finalized_at, id) cursor: it walks relay_jobs_finalized_idx (state,
// finalized_at) backwards and stops at the page, however many finished rows
// the table holds (TestListDeadJobsUsesIndex). With conditions checked row
// by row, it walks at most listScanRows jobs (sqlScanBoundByFinalized says
// where a short page stopped).
func sqlListJobsByFinalized(f jobFilter, after *cursor, limit int) (string, []any) {
	var args []any
	w := f.where(&args, indexedConds)
	if after != nil {
		args = append(args, after.At, after.ID)
		w += fmt.Sprintf(" AND (finalized_at, id) < ($%d, $%d)", len(args)-1, len(args))
	}
	if !f.hasOther() {
		args = append(args, limit)
		return fmt.Sprintf(`SELECT %s FROM relay_jobs WHERE %s ORDER BY finalized_at DESC, id DESC LIMIT $%d`,
			jobColumns, w, len(args)), args
	}
	args = append(args, listScanRows)
	scan := len(args)
	rest := f.where(&args, otherConds)
	args = append(args, limit)
	return fmt.Sprintf(`SELECT %s FROM (
    SELECT %s FROM relay_jobs WHERE %s ORDER BY finalized_at DESC, id DESC LIMIT $%d) AS scanned
WHERE %s ORDER BY finalized_at DESC, id DESC LIMIT $%d`, jobColumns, scannedColumns, w, scan, rest, len(args)), args
}

// sqlScanBoundByFinalized is where a short page of sqlListJobsByFinalized
// stopped: the last of the listScanRows jobs it examined, or no row when
// it examined every job left.
func sqlScanBoundByFinalized(f jobFilter, after *cursor) (string, []any) {
	var args []any
	w := f.where(&args, indexedConds)
	if after != nil {
		args = append(args, after.At, after.ID)
		w += fmt.Sprintf(" AND (finalized_at, id) < ($%d, $%d)", len(args)-1, len(args))
	}
	args = append(args, listScanRows-1)
	return fmt.Sprintf(`SELECT finalized_at, id FROM relay_jobs WHERE %s ORDER BY finalized_at DESC, id DESC OFFSET $%d LIMIT 1`,
		w, len(args)), args
}

// sqlListJobsByID lists jobs newest first by id, after an id cursor. With
// conditions checked row by row, it walks at most listScanRows jobs
// (sqlScanBoundByID says where a short page stopped).
func sqlListJobsByID(f jobFilter, after *cursor, limit int) (string, []any) {
	var args []any
	w := f.where(&args, indexedConds)
	if after != nil {
		args = append(args, after.ID)
		w += fmt.Sprintf(" AND id < $%d", len(args))
	}
	if !f.hasOther() {
		args = append(args, limit)
		return fmt.Sprintf(`SELECT %s FROM relay_jobs WHERE %s ORDER BY id DESC LIMIT $%d`,
			jobColumns, w, len(args)), args
	}
	args = append(args, listScanRows)
	scan := len(args)
	rest := f.where(&args, otherConds)
	args = append(args, limit)
	return fmt.Sprintf(`SELECT %s FROM (
    SELECT %s FROM relay_jobs WHERE %s ORDER BY id DESC LIMIT $%d) AS scanned
WHERE %s ORDER BY id DESC LIMIT $%d`, jobColumns, scannedColumns, w, scan, rest, len(args)), args
}

// sqlScanBoundByID is where a short page of sqlListJobsByID stopped.
func sqlScanBoundByID(f jobFilter, after *cursor) (string, []any) {
	var args []any
	w := f.where(&args, indexedConds)
	if after != nil {
		args = append(args, after.ID)
		w += fmt.Sprintf(" AND id < $%d", len(args))
	}
	args = append(args, listScanRows-1)
	return fmt.Sprintf(`SELECT id FROM relay_jobs WHERE %s ORDER BY id DESC OFFSET $%d LIMIT 1`, w, len(args)), args
}

// sqlBulkBatch picks the next batch of a bulk operation: ids below the last
// batch's smallest, newest first.
func sqlBulkBatch(f jobFilter, belowID int64, limit int) (string, []any) {
	var args []any
	w := f.where(&args, allConds)
	args = append(args, belowID, limit)
	return fmt.Sprintf(`SELECT id FROM relay_jobs WHERE %s AND id < $%d ORDER BY id DESC LIMIT $%d`,
		w, len(args)-1, len(args)), args
}

// sqlBulkCount counts a bulk operation's jobs, up to a cap.
func sqlBulkCount(f jobFilter, max int) (string, []any) {
	var args []any
	w := f.where(&args, allConds)
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
