package scheduler

// All of the scheduler's SQL. Tables: migrations/*_scheduler.tx.up.sql;
// its processes' entries are internal/liveness's.

// sqlDeclare upserts one declared schedule. The next fire is kept unless the
// timing changed (spec or zone) or the schedule comes back from being
// disabled: then it restarts from the fresh next fire ($13), so no catch-up
// runs for a period the schedule did not exist. Paused stays as it was.
//
// A schedule of another namespace ($14) is taken over only when no live
// process of that namespace declares it (live: within that process's own
// liveness timeout of its last heartbeat); otherwise nothing is written and
// no row returns.
const sqlDeclare = `
INSERT INTO relay_schedules AS s
    (name, spec, timezone, kind, args, queue, priority, max_attempts, metadata,
     catch_up, catch_up_limit, overlap, next_fire_at, namespace)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
ON CONFLICT (name) DO UPDATE SET
    spec = excluded.spec, timezone = excluded.timezone, kind = excluded.kind,
    args = excluded.args, queue = excluded.queue, priority = excluded.priority,
    max_attempts = excluded.max_attempts, metadata = excluded.metadata,
    catch_up = excluded.catch_up, catch_up_limit = excluded.catch_up_limit,
    overlap = excluded.overlap,
    next_fire_at = CASE
        WHEN s.spec <> excluded.spec OR s.timezone <> excluded.timezone OR s.disabled_at IS NOT NULL
        THEN excluded.next_fire_at ELSE s.next_fire_at END,
    disabled_at = NULL,
    broken_error = CASE WHEN s.spec <> excluded.spec OR s.timezone <> excluded.timezone
        THEN NULL ELSE s.broken_error END,
    broken_at = CASE WHEN s.spec <> excluded.spec OR s.timezone <> excluded.timezone
        THEN NULL ELSE s.broken_at END,
    namespace = excluded.namespace,
    updated_at = now()
WHERE s.namespace = excluded.namespace OR NOT EXISTS (
    SELECT 1 FROM relay_processes p
    WHERE p.role = 'scheduler' AND p.namespace = s.namespace AND s.name = ANY (p.declares)
      AND relay_process_live(p.heartbeat_at, p.liveness_secs))
RETURNING name`

// sqlOwner names the namespace a schedule belongs to.
const sqlOwner = `SELECT namespace FROM relay_schedules WHERE name = $1`

// sqlRetire disables the schedules of a namespace that no live process of
// it declares: removed from code everywhere it runs. Run under the
// namespace's lock (internal/liveness), where a heartbeat that finds its
// process expired declares again.
const sqlRetire = `
UPDATE relay_schedules s SET disabled_at = now(), updated_at = now()
WHERE s.namespace = $1 AND s.disabled_at IS NULL AND NOT EXISTS (
    SELECT 1 FROM relay_processes p
    WHERE p.role = 'scheduler' AND p.namespace = s.namespace AND s.name = ANY (p.declares)
      AND relay_process_live(p.heartbeat_at, p.liveness_secs))
RETURNING name`

// sqlNow reads the database's clock: all due checks use it.
const sqlNow = `SELECT now()`

// sqlLockDue locks the due schedules that no other scheduler holds. A
// schedule locked elsewhere is being fired there; skipping it is what keeps
// the processes from queueing behind each other. $2 names the schedules this
// process cannot evaluate: they are left to processes that can.
const sqlLockDue = `
SELECT name, spec, timezone, kind, args, queue, priority, max_attempts, metadata,
       catch_up, catch_up_limit, overlap, next_fire_at, last_job_id, now()
FROM relay_schedules
WHERE next_fire_at <= now() AND NOT paused AND disabled_at IS NULL
  AND NOT (name = ANY ($2::text[]))
ORDER BY next_fire_at
LIMIT $1
FOR UPDATE SKIP LOCKED`

// sqlRecordFire claims a fire time. The primary key (schedule, fire_time)
// makes a second claim of the same fire impossible to commit; a fire already
// recorded returns no row and is not enqueued again.
const sqlRecordFire = `
INSERT INTO relay_schedule_fires (schedule, fire_time, outcome)
VALUES ($1, $2, $3)
ON CONFLICT (schedule, fire_time) DO NOTHING
RETURNING fire_time`

const sqlSetFireJob = `
UPDATE relay_schedule_fires SET job_id = $3 WHERE schedule = $1 AND fire_time = $2`

// sqlAdvance moves a schedule past the fires just handled; a process that
// could evaluate it clears any mark of one that could not.
const sqlAdvance = `
UPDATE relay_schedules SET
    next_fire_at = $2,
    broken_error = NULL,
    broken_at    = NULL,
    last_fire_at = coalesce($3, last_fire_at),
    last_job_id  = coalesce($4, last_job_id),
    updated_at   = now()
WHERE name = $1`

// sqlNextDue is how long until the soonest enabled schedule this process
// can evaluate is due ($1: the ones it cannot). An infinite next fire
// (written behind Declare) is left out: it would make the wait infinite, and
// a -infinity one is due now anyway (the tick marks it).
const sqlNextDue = `
SELECT coalesce(extract(epoch FROM min(next_fire_at) - now()), 3600)::float8
FROM relay_schedules WHERE NOT paused AND disabled_at IS NULL AND NOT (name = ANY ($1::text[]))
  AND isfinite(next_fire_at)`

// sqlMarkBroken records why this process cannot evaluate a schedule; the
// first time it was seen stays.
const sqlMarkBroken = `
UPDATE relay_schedules SET broken_error = $2, broken_at = coalesce(broken_at, now())
WHERE name = $1`

// sqlDeleteFires removes fire records older than the retention, a batch at
// a time.
const sqlDeleteFires = `
DELETE FROM relay_schedule_fires WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM relay_schedule_fires
    WHERE recorded_at < now() - make_interval(secs => $1)
    LIMIT $2))`

const sqlList = `
SELECT name, namespace, spec, timezone, kind, args, queue, catch_up, overlap,
       next_fire_at, last_fire_at, last_job_id, paused, disabled_at, broken_error, broken_at
FROM relay_schedules ORDER BY name`

const sqlLockOne = `
SELECT name, spec, timezone, kind, args, queue, priority, max_attempts, metadata,
       catch_up, catch_up_limit, overlap, next_fire_at, last_job_id, now()
FROM relay_schedules WHERE name = $1 FOR UPDATE`

const sqlPause = `
UPDATE relay_schedules SET paused = true, updated_at = now() WHERE name = $1`

// sqlResume restarts a paused schedule from its next fire after now: fires
// during the pause are not caught up.
const sqlResume = `
UPDATE relay_schedules SET paused = false, next_fire_at = $2, updated_at = now()
WHERE name = $1`

// sqlNameSession sets application_name for the rest of the transaction
// (transaction-local: nothing outlives it, through a transaction-pooling
// proxy included).
const sqlNameSession = `SELECT set_config('application_name', $1, true)`

// sqlRecordBackfill claims past fire time $2 of schedule $1 for a backfill:
// a fire not recorded yet, or one the overlap policy skipped (it enqueued
// nothing). A fire that enqueued a job (its own, a trigger's or an earlier
// backfill's) returns no row: the fire's key holds, and nothing is
// enqueued again.
const sqlRecordBackfill = `
INSERT INTO relay_schedule_fires AS f (schedule, fire_time, outcome)
VALUES ($1, $2, 'backfilled')
ON CONFLICT (schedule, fire_time) DO UPDATE SET outcome = 'backfilled', recorded_at = now()
    WHERE f.outcome = 'skipped_overlap'
RETURNING fire_time`

// sqlFireOf reads fire $2 of schedule $1: its outcome and job.
const sqlFireOf = `
SELECT outcome, coalesce(job_id, 0) FROM relay_schedule_fires WHERE schedule = $1 AND fire_time = $2`
