package workflow

import "github.com/relayq/relay/internal/jobinsert"

// All of the workflow layer's SQL. Every write an execution makes (a
// checkpoint, a consumed signal, a child started, the run's outcome) runs in
// a transaction that ends with the lease fence (internal/fence) on the run's job: it commits
// only while the execution's attempt still holds the run, so a late
// execution can record nothing (see checkpoint.go).

// sqlStartRun creates a run unless its id exists (its tags $9 a JSON
// array: every database/sql driver sends text) and, with it, the core
// job that executes it: the job's id is drawn from relay_jobs' sequence
// into the run row, and the core's enqueue statement (internal/jobinsert)
// inserts the job, through relay_jobs' triggers, once per run row
// inserted. It returns the job's id; no row for an existing id, which
// sqlRunIdentity then says which workflow holds.
var sqlStartRun = startRunSQL(jobinsert.NotifyAtCommit)

// sqlStartRunAfter is sqlStartRun for a start that is its own transaction
// (on a pool): the job's wake-up is sent after the commit (jobinsert.One.Wake),
// not by a NOTIFY in the transaction, whose commits PostgreSQL serialises.
var sqlStartRunAfter = startRunSQL(jobinsert.NotifyAfter)

func startRunSQL(n jobinsert.Notify) string {
	return `
WITH run AS (
    INSERT INTO relay_workflow_runs (id, workflow, input, queue, parent_id, parent_position, trace, job_id, tags, deadline_at)
    VALUES ($1, $2, $3::jsonb, $4, nullif($5, ''), $6, $7::jsonb, nextval(pg_get_serial_sequence('relay_jobs', 'id')),
            ARRAY(SELECT t FROM jsonb_array_elements_text($9::jsonb) WITH ORDINALITY AS e(t, i) ORDER BY i),
            now() + $10::bigint * interval '1 microsecond')
    ON CONFLICT (id) DO NOTHING
    RETURNING job_id
), job AS (` + jobinsert.SQLInto("run", "job_id", 8, n) + `)
SELECT id FROM job`
}

// sqlStartChild starts child run $1 of parent $5 at position $6, as
// sqlStartRunAfter starts a run (its job $8, woken after the commit;
// parent-close policy $10, NULL for the default), and records the
// parent's checkpoint of it (key $9, waiting) in the same statement, only
// if the run was inserted: the child and its place in the parent's
// history are written together or not at all. It returns the job's id; no
// row when the id is taken, and nothing is written (the caller then finds
// out by whom, in a transaction of its own). The checkpoint is written as
// sqlUpsertStep writes a child's.
var sqlStartChild = `
WITH run AS (
    INSERT INTO relay_workflow_runs (id, workflow, input, queue, parent_id, parent_position, trace, job_id, tags, parent_close)
    VALUES ($1, $2, $3::jsonb, $4, $5, $6, $7::jsonb, nextval(pg_get_serial_sequence('relay_jobs', 'id')), '{}'::text[], $10)
    ON CONFLICT (id) DO NOTHING
    RETURNING job_id
), job AS (` + jobinsert.SQLInto("run", "job_id", 8, jobinsert.NotifyAfter) + `
), step AS (
    INSERT INTO relay_workflow_steps (run_id, position, key, kind, state, attempts, child_id, attempt_log, started_at)
    SELECT $5, $6, $9, 'child', 'waiting', 0, $1, '[]'::jsonb, now() FROM run
    ON CONFLICT (run_id, position) DO UPDATE
    SET state = excluded.state, output = NULL, error = NULL, error_info = NULL, wake_at = NULL,
        child_id = excluded.child_id, finished_at = NULL
)
SELECT id FROM job`

// sqlStartChildClaimed is sqlStartChild with the child's job inserted
// already claimed (jobinsert.SQLIntoClaimed) by worker $11, lease token
// $12, for $13 milliseconds: the parent's execution runs the child in its
// own worker slot next (executeChildStart), and the claim is the insert's,
// not an update of the row after it. It returns the job's id and its
// attempted_at, NULL when the job was inserted queued (a paused queue, a
// global limit); no row when the id is taken, as sqlStartChild. The child
// is asked to cancel if its parent is, unless it is abandoned (as Cancel
// asks a run's unfinished children, relay_workflow_request_cancel): the
// parent's execution runs it next without looking at the flag this statement's snapshot may be the first to see, and the child,
// reading its own at its start, then runs no step.
var sqlStartChildClaimed = `
WITH run AS (
    INSERT INTO relay_workflow_runs (id, workflow, input, queue, parent_id, parent_position, trace, job_id, tags, parent_close, cancel_requested)
    VALUES ($1, $2, $3::jsonb, $4, $5, $6, $7::jsonb, nextval(pg_get_serial_sequence('relay_jobs', 'id')), '{}'::text[], $10,
            $10::text IS DISTINCT FROM 'abandon'
            AND coalesce((SELECT p.cancel_requested FROM relay_workflow_runs AS p WHERE p.id = $5), false))
    ON CONFLICT (id) DO NOTHING
    RETURNING job_id
), job AS (` + jobinsert.SQLIntoClaimed("run", "job_id", 8, jobinsert.NotifyAfter, jobinsert.Claim{By: 11, Token: 12, LeaseMS: 13}) + `
), step AS (
    INSERT INTO relay_workflow_steps (run_id, position, key, kind, state, attempts, child_id, attempt_log, started_at)
    SELECT $5, $6, $9, 'child', 'waiting', 0, $1, '[]'::jsonb, now() FROM run
    ON CONFLICT (run_id, position) DO UPDATE
    SET state = excluded.state, output = NULL, error = NULL, error_info = NULL, wake_at = NULL,
        child_id = excluded.child_id, finished_at = NULL
)
SELECT id, attempted_at FROM job`

// sqlRunIdentity reads who holds run id $1: its workflow and its parent's
// link (” and NULL for none).
const sqlRunIdentity = `SELECT workflow, coalesce(parent_id, ''), parent_position FROM relay_workflow_runs WHERE id = $1`

// sqlSetRunJob records the job that executes run $1 (Retry).
const sqlSetRunJob = `UPDATE relay_workflow_runs SET job_id = $2 WHERE id = $1`

// sqlLoadRun reads what an execution needs of its run, the job executing
// it, and the database's clock (every due check of the execution compares
// with it).
const sqlLoadRun = `
SELECT workflow, state, input::text, queue, coalesce(parent_id, ''), trace::text,
       cancel_requested, generation, executions, coalesce(job_id, 0), now(), deadline_at
FROM relay_workflow_runs
WHERE id = $1`

// sqlLoadSteps reads a run's history from position $2 on in one
// statement, whatever its length: a replay costs one query however many
// steps it passes.
const sqlLoadSteps = `
SELECT position, key, kind, state, coalesce(output::text, ''), coalesce(error, ''), attempts,
       wake_at, coalesce(child_id, ''), coalesce(error_info::text, ''), started_at
FROM relay_workflow_steps
WHERE run_id = $1 AND position >= $2
ORDER BY position`

// sqlJobLastError reads why the previous attempt of job $1 ended.
const sqlJobLastError = `SELECT coalesce(last_error, '') FROM relay_jobs WHERE id = $1`

// sqlTouchRun marks the run started by its first checkpoint of each
// execution, in that checkpoint's transaction (no write of its own), and
// returns whether a cancel has been asked for meanwhile.
const sqlTouchRun = `
UPDATE relay_workflow_runs
SET state       = CASE WHEN state = 'pending' THEN 'running' ELSE state END,
    started_at  = coalesce(started_at, now()),
    executions  = executions + 1
WHERE id = $1
RETURNING cancel_requested`

// sqlCancelRequested reads the cancel flag (checkpoints after the first).
const sqlCancelRequested = `SELECT cancel_requested FROM relay_workflow_runs WHERE id = $1`

// sqlUpsertStep writes the checkpoint at ($1 run, $2 position). A position
// is rewritten only by the run's later executions (a retried step, a sleep
// or a wait that ends); attempts accumulate ($8 is this write's share).
// wake_at is absolute ($9) or database now() plus $10 microseconds. $12,
// when not NULL, is a step attempt (StepAttempt) appended to the attempt
// log, which keeps the latest maxAttemptLog (20) entries; a write without
// one (a value, a child, a sleep) leaves the log as it is
// (jsonb_build_array(NULL) would be [null], not an empty log). $13 is a
// failed step's error description (describeError), empty for none. $14
// is when the step's first attempt began (database clock), for a step
// whose row this write creates (NULL: now()); later writes keep it.
const sqlUpsertStep = `
INSERT INTO relay_workflow_steps (run_id, position, key, kind, state, output, error, attempts, wake_at, child_id, finished_at, attempt_log, error_info, started_at)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, nullif($7, ''), $8,
        coalesce($9::timestamptz, now() + $10::bigint * interval '1 microsecond'),
        nullif($11, ''),
        CASE WHEN $5 IN ('completed', 'failed') THEN now() END,
        CASE WHEN $12::jsonb IS NULL THEN '[]'::jsonb ELSE jsonb_build_array($12::jsonb) END,
        nullif($13, '')::jsonb, coalesce($14::timestamptz, now()))
ON CONFLICT (run_id, position) DO UPDATE
SET state       = excluded.state,
    output      = excluded.output,
    error       = excluded.error,
    error_info  = excluded.error_info,
    attempts    = relay_workflow_steps.attempts + excluded.attempts,
    wake_at     = excluded.wake_at,
    child_id    = coalesce(excluded.child_id, relay_workflow_steps.child_id),
    finished_at = excluded.finished_at,
    attempt_log = CASE
        WHEN excluded.attempt_log = '[]' THEN relay_workflow_steps.attempt_log
        WHEN jsonb_array_length(relay_workflow_steps.attempt_log) >= 20 THEN (relay_workflow_steps.attempt_log - 0) || excluded.attempt_log
        ELSE relay_workflow_steps.attempt_log || excluded.attempt_log END
RETURNING wake_at`

// sqlUpsertStepFenced is sqlUpsertStep as the last statement of a
// checkpoint batch (batchWrite), with the batch's lease check and cancel
// read folded in: the row is written only while job $15 holds lease token
// $16, whose row the statement locks FOR SHARE (as fence.Check: when no row
// is locked, relay_hold_lease raises RLY02 and the batch's implicit
// transaction rolls back), and it returns the run's cancel flag beside
// wake_at. It locks no run row, so a batch that locks its run's row (the
// touch, the outcome) still does so before the job's. Its parameters are
// cast, as an INSERT … SELECT's are not typed by the columns they fill.
const sqlUpsertStepFenced = `
INSERT INTO relay_workflow_steps (run_id, position, key, kind, state, output, error, attempts, wake_at, child_id, finished_at, attempt_log, error_info, started_at)
SELECT $1::text, $2::int, $3::text, $4::text, $5::text, $6::jsonb, nullif($7::text, ''), $8::int,
       coalesce($9::timestamptz, now() + $10::bigint * interval '1 microsecond'),
       nullif($11::text, ''),
       CASE WHEN $5::text IN ('completed', 'failed') THEN now() END,
       CASE WHEN $12::jsonb IS NULL THEN '[]'::jsonb ELSE jsonb_build_array($12::jsonb) END,
       nullif($13::text, '')::jsonb, coalesce($14::timestamptz, now())
FROM (SELECT count(*) AS n FROM (
    SELECT 1 FROM relay_jobs WHERE id = $15 AND lease_token = $16::uuid FOR SHARE) AS l) AS held
WHERE CASE WHEN held.n > 0 THEN true ELSE relay_hold_lease($15, $16::uuid) IS NOT NULL END
ON CONFLICT (run_id, position) DO UPDATE
SET state       = excluded.state,
    output      = excluded.output,
    error       = excluded.error,
    error_info  = excluded.error_info,
    attempts    = relay_workflow_steps.attempts + excluded.attempts,
    wake_at     = excluded.wake_at,
    child_id    = coalesce(excluded.child_id, relay_workflow_steps.child_id),
    finished_at = excluded.finished_at,
    attempt_log = CASE
        WHEN excluded.attempt_log = '[]' THEN relay_workflow_steps.attempt_log
        WHEN jsonb_array_length(relay_workflow_steps.attempt_log) >= 20 THEN (relay_workflow_steps.attempt_log - 0) || excluded.attempt_log
        ELSE relay_workflow_steps.attempt_log || excluded.attempt_log END
RETURNING wake_at, (SELECT cancel_requested FROM relay_workflow_runs WHERE id = $1)`

// sqlCompleteWaits marks due sleeps completed (positions $2), lazily, in
// the next transaction the execution writes anyway.
const sqlCompleteWaits = `
UPDATE relay_workflow_steps
SET state = 'completed', finished_at = coalesce(wake_at, now())
WHERE run_id = $1 AND position = ANY($2::int[]) AND state = 'waiting'`

// sqlFinishRun records a run's outcome and returns its parent's job (0 for
// none), which the same transaction wakes. It records no completion while
// a cancel is requested (no row: the execution compensates and ends the run
// cancelled instead), nor a compensated end (no row: every compensation
// ran, and the execution ends the run cancelled); the trigger
// relay_workflow_runs_cancel_wins refuses both from any other writer. Cancel locks the run's row to set the flag, so
// this statement either commits first or sees the flag. $5 is the position
// Retry resumes a failed run from (NULL: none; see sqlRetryDropSteps).
const sqlFinishRun = `
UPDATE relay_workflow_runs AS r
SET state = $2, output = $3::jsonb, error = nullif($4, ''), finished_at = now(), retry_from = $5
WHERE r.id = $1 AND r.state IN ('pending', 'running', 'compensating')
  AND NOT ($2 IN ('completed', 'compensated') AND r.cancel_requested)
RETURNING coalesce((SELECT p.job_id FROM relay_workflow_runs AS p WHERE p.id = r.parent_id AND p.finished_at IS NULL), 0)`

// sqlFinishRootRun is sqlFinishRun for a run without a parent, in a batch,
// with the same refusal of a completed or compensated end while a cancel is
// requested (no row updated). The Result callers waiting on it are woken after the commit
// (announcer). $6 is 1 when the outcome is its execution's first write
// (sqlTouchRun's work, done here, as sqlFinishChildRun does it), 0
// otherwise.
const sqlFinishRootRun = `
UPDATE relay_workflow_runs
SET state = $2, output = $3::jsonb, error = nullif($4, ''), finished_at = now(), retry_from = $5,
    started_at = coalesce(started_at, now()), executions = executions + $6
WHERE id = $1 AND state IN ('pending', 'running', 'compensating')
  AND NOT ($2 IN ('completed', 'compensated') AND cancel_requested)`

// sqlFinishChildRun is sqlFinishRootRun for a child run, in a batch: it
// also wakes the parent's job (relay_workflow_wake: never waiting for its
// row), in the same statement, as sqlFinishRun and sqlWakeParent do in a
// transaction. It returns a row when it recorded the outcome, none when a
// requested cancel refused it.
//
// A child executed in its parent's worker slot (executeChild) names the
// parent's job $6 and the lease token $7 of the execution waiting for it:
// while that execution still holds the parent's job under that lease, the
// wake-up is skipped, as that execution reads the outcome itself. The job
// row is locked FOR SHARE for the check, so the lease cannot be lost (the
// rescuer's requeue, a cancel) between the check and this commit: an
// execution of the parent that begins after either sees the outcome
// committed. $6 0 is no such parent.
//
// $8 is 1 when the outcome is its execution's first write (sqlTouchRun's
// work, done here: the run marked started and its execution counted, in
// the same update of its row), 0 otherwise.
//
// The same statement writes that execution's checkpoint of a completed
// child (the parent's step at the child's position, waiting until now) as
// sqlUpsertStep would have at the parent's next write, under the parent's
// lease (the same row lock; no row, no write): the parent resumes from it
// without writing it. A child that did not complete is left to the
// parent's own write, which reads the parent's cancel flag.
const sqlFinishChildRun = `
WITH ended AS (
    UPDATE relay_workflow_runs AS r
    SET state = $2, output = $3::jsonb, error = nullif($4, ''), finished_at = now(), retry_from = $5,
        started_at = coalesce(r.started_at, now()), executions = r.executions + $8
    WHERE r.id = $1 AND r.state IN ('pending', 'running', 'compensating')
      AND NOT ($2 IN ('completed', 'compensated') AND r.cancel_requested)
    RETURNING r.parent_id, r.parent_position,
              coalesce((SELECT p.job_id FROM relay_workflow_runs AS p WHERE p.id = r.parent_id AND p.finished_at IS NULL), 0) AS parent_job
), waiting AS (
    SELECT j.id FROM relay_jobs AS j
    WHERE j.id = $6 AND j.id = (SELECT parent_job FROM ended)
      AND j.state = 'claimed' AND j.lease_token = $7::uuid
    FOR SHARE
), resumed AS (
    UPDATE relay_workflow_steps AS s
    SET state = 'completed', output = $3::jsonb, error = NULL, error_info = NULL,
        attempts = s.attempts + 1, wake_at = NULL, finished_at = now()
    FROM ended
    WHERE $2 = 'completed' AND EXISTS (SELECT 1 FROM waiting)
      AND s.run_id = ended.parent_id AND s.position = ended.parent_position
      AND s.state = 'waiting' AND s.child_id = $1
)
SELECT (SELECT relay_workflow_wake(ARRAY[ended.parent_job]) WHERE NOT EXISTS (SELECT 1 FROM waiting)) FROM ended`

// sqlSetRunState moves a run to $2 (running → compensating).
const sqlSetRunState = `UPDATE relay_workflow_runs SET state = $2 WHERE id = $1 AND state <> $2`

// sqlNotifyDone wakes Result callers waiting on run $1. Delivered at commit.
const sqlNotifyDone = `SELECT pg_notify('relay_workflow', $1::text)`

// sqlAnnounceDone wakes Result callers waiting on runs $1 and UpdateResult
// callers waiting on updates $2, after the commits that recorded the runs'
// ends and the updates' answers (announcer).
const sqlAnnounceDone = `
SELECT pg_notify(n.channel, n.payload)
FROM (SELECT 'relay_workflow', id FROM unnest($1::text[]) AS id
      UNION ALL
      SELECT 'relay_workflow_update', id::text FROM unnest($2::bigint[]) AS id) AS n (channel, payload)`

// sqlRunOutcome reads a run's state and outcome (Result).
const sqlRunOutcome = `
SELECT workflow, state, coalesce(output::text, ''), coalesce(error, '')
FROM relay_workflow_runs WHERE id = $1`

// sqlConsumeSignal takes the oldest unconsumed signal $2 of run $1 for the
// wait at position $3, and returns its id and payload. It runs in the
// wait's checkpoint transaction, so a signal is consumed exactly when the
// wait is recorded: a refused checkpoint leaves it in the mailbox.
const sqlConsumeSignal = `
UPDATE relay_workflow_signals
SET consumed_at = now(), consumed_by = $3
WHERE id = (
    SELECT id FROM relay_workflow_signals
    WHERE run_id = $1 AND name = $2 AND consumed_at IS NULL
    ORDER BY id
    LIMIT 1
    FOR UPDATE)
RETURNING id, payload::text`

// sqlSetSignalAside marks signal $1, just taken by sqlConsumeSignal, as
// set aside with decoding error $2: out of the mailbox, received by no
// wait (consumed_by NULL), in the same transaction.
const sqlSetSignalAside = `
UPDATE relay_workflow_signals SET consumed_by = NULL, decode_error = $2 WHERE id = $1`

// sqlInsertSignal puts signal $2 in run $1's mailbox, if the run is not
// finished, and returns the run's job to wake.
const sqlInsertSignal = `
INSERT INTO relay_workflow_signals (run_id, name, payload)
SELECT id, $2, $3::jsonb FROM relay_workflow_runs
WHERE id = $1 AND finished_at IS NULL
RETURNING (SELECT coalesce(job_id, 0) FROM relay_workflow_runs WHERE id = $1)`

// sqlRunState tells a missing run from a finished one.
const sqlRunState = `SELECT state FROM relay_workflow_runs WHERE id = $1`

// sqlChildOutcome reads a child run's outcome for its parent.
const sqlChildOutcome = `
SELECT state, coalesce(output::text, ''), coalesce(error, ''), finished_at IS NOT NULL
FROM relay_workflow_runs WHERE id = $1`

// sqlRequestCancel asks run $1 and its unfinished descendants to cancel,
// wakes their jobs, and returns how many runs it asked. The tree walk, its
// lock order (parents first) and the wake-ups (never waiting for a job's
// row: held ones are handed off, migration 20261201000001) are
// relay_workflow_cancel_tree's (migration 20261201000006), shared with sqlRequestCancelChildren and the trigger
// relay_workflow_job_ended.
const sqlRequestCancel = `SELECT relay_workflow_cancel_tree($1, true)`

// sqlRetryRun puts failed run $1 back to pending and returns its job and
// the position to resume it from (retry_from, recorded with its failure;
// cleared). A cancel asked for before the run failed is kept if the run had
// begun compensating (whatever failed it then: a compensation, or its job
// ending dead): the run resumes its compensations and ends cancelled,
// instead of going on with its function past the point where the cancel
// stopped it. A cancel the run never acted on (one asked of a child by its
// parent's end, say) is forgotten. The old retry_from is read from the
// row locked by the subquery, as RETURNING sees only the new one.
const sqlRetryRun = `
UPDATE relay_workflow_runs AS r
SET state = 'pending', finished_at = NULL, error = NULL, output = NULL, retry_from = NULL, deadline_at = NULL,
    cancel_requested = r.cancel_requested AND EXISTS (
        SELECT 1 FROM relay_workflow_steps AS l
        WHERE l.run_id = r.id AND l.kind = 'step' AND starts_with(l.key, 'compensate:'))
FROM (SELECT id, retry_from FROM relay_workflow_runs WHERE id = $1 FOR UPDATE) AS old
WHERE r.id = old.id AND r.state = 'failed'
RETURNING coalesce(r.job_id, 0), old.retry_from`

// sqlJobPlacement reads the priority and max attempts of a run's job $1.
const sqlJobPlacement = `SELECT priority, max_attempts FROM relay_jobs WHERE id = $1`

// sqlRetryDropSteps is Retry's drop for run $1 failed by the step at
// position $2 (retry_from): that step and those after it go, so the
// replay runs it again, except that nothing at or before a completed
// StepTx, a consumed signal wait or a Select that chose a signal is ever
// dropped (running a StepTx again would repeat its writes; dropping a wait
// would lose its signal, consumed with it). Such a step after the failed one moves the resume point past
// it: the failed step is then kept, and the run replays to the same error
// unless its code changed. NULL drops nothing.
const sqlRetryDropSteps = `
DELETE FROM relay_workflow_steps
WHERE run_id = $1 AND $2::int IS NOT NULL AND position >= greatest($2::int,
    (SELECT coalesce(max(position), -1) + 1 FROM relay_workflow_steps
     WHERE run_id = $1 AND state = 'completed'
       AND (kind IN ('tx', 'signal') OR (kind = 'select' AND output ? 'payload'))))`

// sqlContinueAsNew restarts run $1 with input $2 and an empty history.
const sqlContinueAsNew = `
UPDATE relay_workflow_runs
SET input = $2::jsonb, generation = generation + 1
WHERE id = $1`

const sqlDropHistory = `DELETE FROM relay_workflow_steps WHERE run_id = $1`

// sqlDropStaleHeartbeats deletes run $1's heartbeats of positions that no
// longer hold a step (after sqlDropHistory or sqlRetryDropSteps): a step
// run again there is a new step, whose first attempt finds no details of
// the one dropped, and whose attempts (counted from 1 again) are not
// refused as older than the dropped step's.
const sqlDropStaleHeartbeats = `
DELETE FROM relay_workflow_heartbeats AS h
WHERE h.run_id = $1 AND NOT EXISTS (
    SELECT 1 FROM relay_workflow_steps AS s WHERE s.run_id = h.run_id AND s.position = h.position)`

// sqlSetEvent publishes value $3 under key $2 of run $1.
const sqlSetEvent = `
INSERT INTO relay_workflow_events (run_id, key, value) VALUES ($1, $2, $3::jsonb)
ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value, updated_at = now()`

const sqlGetEvent = `SELECT value::text FROM relay_workflow_events WHERE run_id = $1 AND key = $2`

// sqlGetRun reads one run for inspection.
const sqlGetRun = `
SELECT id, workflow, state, input::text, coalesce(output::text, ''), coalesce(error, ''), queue,
       coalesce(job_id, 0), coalesce(parent_id, ''), trace::text, cancel_requested, generation,
       executions, created_at, started_at, finished_at, array_to_json(tags)::text
FROM relay_workflow_runs WHERE id = $1`

// sqlListRuns lists runs newest first, after a keyset cursor ($3 created_at,
// $4 id; NULL from the start), optionally of one workflow ($1) and state ($2).
const sqlListRuns = `
SELECT id, workflow, state, input::text, coalesce(output::text, ''), coalesce(error, ''), queue,
       coalesce(job_id, 0), coalesce(parent_id, ''), trace::text, cancel_requested, generation,
       executions, created_at, started_at, finished_at, array_to_json(tags)::text
FROM relay_workflow_runs
WHERE ($1 = '' OR workflow = $1) AND ($2 = '' OR state = $2)
  AND ($3::timestamptz IS NULL OR (created_at, id) < ($3::timestamptz, $4))
ORDER BY created_at DESC, id DESC
LIMIT $5`

// sqlListTaggedRuns is sqlListRuns of the runs carrying every tag of $6
// (a JSON array, not empty): written out, so that its plan can read
// relay_workflow_runs_tags_idx, whose predicate the condition implies.
const sqlListTaggedRuns = `
SELECT id, workflow, state, input::text, coalesce(output::text, ''), coalesce(error, ''), queue,
       coalesce(job_id, 0), coalesce(parent_id, ''), trace::text, cancel_requested, generation,
       executions, created_at, started_at, finished_at, array_to_json(tags)::text
FROM relay_workflow_runs
WHERE tags @> ARRAY(SELECT jsonb_array_elements_text($6::jsonb)) AND tags <> '{}'
  AND ($1 = '' OR workflow = $1) AND ($2 = '' OR state = $2)
  AND ($3::timestamptz IS NULL OR (created_at, id) < ($3::timestamptz, $4))
ORDER BY created_at DESC, id DESC
LIMIT $5`

// sqlRunTags reads run $1's tags (AddTags, in its checkpoint's
// transaction: the execution holding the run is their only writer).
const sqlRunTags = `SELECT tags FROM relay_workflow_runs WHERE id = $1`

// sqlSetRunTags sets run $1's tags to $2 (AddTags).
const sqlSetRunTags = `UPDATE relay_workflow_runs SET tags = $2::text[] WHERE id = $1`

// sqlStepTimeline reads a run's steps for inspection.
const sqlStepTimeline = `
SELECT position, key, kind, state, coalesce(output::text, ''), coalesce(error, ''), attempts,
       wake_at, coalesce(child_id, ''), started_at, finished_at, attempt_log::text
FROM relay_workflow_steps
WHERE run_id = $1
ORDER BY position`

// sqlDeleteRun deletes finished run $1 with its descendants (child runs,
// theirs), all finished, or nothing when one of them is not: a child left
// behind would be adopted by nothing (Child adopts only its own parent's
// child), and would hold its id against the next run's child. Their
// steps, signals and events go in the same statement (ON DELETE CASCADE;
// the steps by trigger relay_workflow_runs_deleted).
const sqlDeleteRun = `
WITH RECURSIVE tree AS (
    SELECT id, finished_at FROM relay_workflow_runs WHERE id = $1
    UNION
    SELECT c.id, c.finished_at FROM relay_workflow_runs AS c JOIN tree ON c.parent_id = tree.id
)
DELETE FROM relay_workflow_runs
WHERE id IN (SELECT id FROM tree)
  AND NOT EXISTS (SELECT 1 FROM tree WHERE finished_at IS NULL)`

// sqlDeleteFinished deletes up to $2 runs finished more than $1
// microseconds ago, with their steps, signals and events. A child whose
// parent is still running is kept: the parent reads its outcome.
const sqlDeleteFinished = `
DELETE FROM relay_workflow_runs
WHERE id IN (
    SELECT r.id FROM relay_workflow_runs AS r
    WHERE r.finished_at < now() - $1 * interval '1 microsecond'
      AND NOT EXISTS (SELECT 1 FROM relay_workflow_runs AS p WHERE p.id = r.parent_id AND p.finished_at IS NULL)
    ORDER BY r.finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)`

// sqlBoundIdleTx ends the transaction on the server if it sits idle longer
// than $1 milliseconds (see execution.writeTx).
const sqlBoundIdleTx = `SELECT set_config('idle_in_transaction_session_timeout', $1, true)`

// sqlRetryDropFailedCompensations is Retry's drop of the compensations
// that failed: a run fails in its compensations after running every one
// (one failing does not stop the older ones), so those that completed,
// before or after a failed one, are kept and not repeated, and the step
// that failed the function is kept too (its run records no retry_from):
// the replay fails the same way and resumes the compensations. The
// compensations' positions do not move, as the replay registers the same
// ones in the same order. Keys starting with "compensate:" are the
// package's alone (ErrReservedKey).
const sqlRetryDropFailedCompensations = `
DELETE FROM relay_workflow_steps
WHERE run_id = $1 AND state = 'failed' AND kind = 'step' AND starts_with(key, 'compensate:')`

// sqlWakeParent wakes job $1, the parent's, when a child run ends: as
// core.Wake, but never waiting for the job's row (relay_workflow_wake,
// migration 20261201000001: a held row is handed off and woken once free).
// The child's end holds its
// run row, and the parent's job ending at that moment holds the job's row
// and asks for the child's run row: core.Wake deadlocked there
// (TestChildEndWhileParentJobEnds).
const sqlWakeParent = `SELECT relay_workflow_wake(ARRAY[$1::bigint])`

// sqlRequestCancelChildren is sqlRequestCancel for the unfinished
// descendants of run $1, not the run itself (a run continuing as new
// closes its children and goes on).
const sqlRequestCancelChildren = `SELECT relay_workflow_cancel_tree($1, false)`

// sqlEagerStartClaimed inserts an eagerly started run (RunNow) and its
// job in one statement, the job already claimed (jobinsert.SQLIntoClaimed)
// by worker $8, lease token $9, for $10 milliseconds: the caller's client
// executes it next, in a worker slot reserved for it (eager.Inserter.Lend).
// It returns the job's id and its attempted_at, NULL when the job was
// inserted queued (a paused queue, a global limit). No ON CONFLICT: a run
// id in use fails the statement (23505, relay_workflow_runs_pkey), nothing
// written, and RunNow then reads the existing run.
//
// The run's row is selected from a set_config of lock_timeout (local to
// the statement's own transaction) so that the setting is made before the
// row is inserted: a start of the same id not yet committed makes the
// insert wait for that start's transaction, which holds the caller's
// worker slot; past 100 ms the statement fails (55P03), nothing written,
// and RunNow waits for the run with a queued start instead, which holds
// no slot. The same bound covers the job's insert.
var sqlEagerStartClaimed = `
WITH run AS (
    INSERT INTO relay_workflow_runs (id, workflow, input, queue, trace, job_id, tags)
    SELECT $1, $2, $3::jsonb, $4, $5::jsonb, nextval(pg_get_serial_sequence('relay_jobs', 'id')), $6::text[]
    FROM (SELECT set_config('lock_timeout', '100ms', true)) AS bounded
    RETURNING job_id
), job AS (` + jobinsert.SQLIntoClaimed("run", "job_id", 7, jobinsert.NotifyAfter, jobinsert.Claim{By: 8, Token: 9, LeaseMS: 10}) + `
)
SELECT id, attempted_at FROM job`

// sqlTerminateRun ends unfinished run $1 terminated with error $2 and
// returns its job (0: none). The same statement asks the run's unfinished
// descendants to cancel, wakes its parent's job (never waiting for that
// job's row: relay_workflow_wake) and notifies its Result callers; the
// caller cancels the job (core.Cancel) after it, in the same transaction.
const sqlTerminateRun = `
WITH ended AS (
    UPDATE relay_workflow_runs AS r
    SET state = 'terminated', error = $2, finished_at = now()
    WHERE r.id = $1 AND r.finished_at IS NULL
    RETURNING r.id, coalesce(r.job_id, 0) AS job_id,
              coalesce((SELECT p.job_id FROM relay_workflow_runs AS p
                        WHERE p.id = r.parent_id AND p.finished_at IS NULL), 0) AS parent_job
)
SELECT ended.job_id
FROM ended,
     LATERAL (SELECT relay_workflow_cancel_tree(ended.id, false),
                     relay_workflow_wake(ARRAY[ended.parent_job]),
                     pg_notify('relay_workflow', ended.id)) AS side`

// sqlLockRunState reads run $1's state and locks its row (a start's id
// policy decides on it).
const sqlLockRunState = `SELECT state FROM relay_workflow_runs WHERE id = $1 FOR NO KEY UPDATE`

// sqlUnfinishedTree lists run $1 and its unfinished descendants, parents
// first (the lock order of a tree's writers).
const sqlUnfinishedTree = `
WITH RECURSIVE tree AS (
    SELECT $1::text AS id, 0 AS depth
    UNION
    SELECT c.id, tree.depth + 1 FROM relay_workflow_runs AS c JOIN tree ON c.parent_id = tree.id
)
SELECT r.id FROM relay_workflow_runs AS r JOIN tree ON r.id = tree.id
WHERE r.finished_at IS NULL
ORDER BY tree.depth, r.id`

// sqlStartRunsAfter is StartMany's statement: the runs of the JSON array
// $1 (id, workflow, input, queue, trace, tags), each with its job, the
// job at the same position of the JSON array $2 (internal/jobinsert), in
// one statement however many runs. A run whose id exists is not inserted
// and gets no job; the statement returns the ids of the runs it inserted
// and their jobs' ids. Its queue wake-ups are sent after the commit
// (jobinsert.NotifyAfter); sqlStartRunsAtCommit is it in a caller's
// transaction.
var sqlStartRunsAfter = startRunsSQL(jobinsert.NotifyAfter)

// sqlStartRunsAtCommit is sqlStartRunsAfter in a caller's transaction: the
// wake-ups ride on its commit.
var sqlStartRunsAtCommit = startRunsSQL(jobinsert.NotifyAtCommit)

func startRunsSQL(n jobinsert.Notify) string {
	return `
WITH given AS (
    SELECT * FROM ROWS FROM (jsonb_to_recordset($1::jsonb) AS (
             id text, workflow text, input jsonb, queue text, trace jsonb, tags text[]))
         WITH ORDINALITY AS g(id, workflow, input, queue, trace, tags, ord)
), run AS (
    INSERT INTO relay_workflow_runs (id, workflow, input, queue, trace, job_id, tags)
    SELECT id, workflow, input, queue, trace, nextval(pg_get_serial_sequence('relay_jobs', 'id')), coalesce(tags, '{}')
    FROM given
    ORDER BY ord
    ON CONFLICT (id) DO NOTHING
    RETURNING id, job_id
), placed AS (
    SELECT run.id, run.job_id, given.ord FROM run JOIN given USING (id)
), job AS (` + jobinsert.SQLIntoEach("placed", "job_id", "ord", 2, n) + `)
SELECT placed.id, job.id FROM placed JOIN job ON job.id = placed.job_id`
}

// sqlRunIdentities is sqlRunIdentity for the runs of ids $1 (a JSON array).
const sqlRunIdentities = `
SELECT id, workflow, parent_id IS NOT NULL FROM relay_workflow_runs
WHERE id IN (SELECT jsonb_array_elements_text($1::jsonb))`

// sqlRunOutcomes is sqlRunOutcome for the finished runs among ids $1 (a
// JSON array); a missing run is returned with an empty state.
const sqlRunOutcomes = `
SELECT i.id, coalesce(r.workflow, ''), coalesce(r.state, ''), coalesce(r.output::text, ''), coalesce(r.error, '')
FROM jsonb_array_elements_text($1::jsonb) AS i(id)
LEFT JOIN relay_workflow_runs AS r ON r.id = i.id
WHERE r.id IS NULL OR r.finished_at IS NOT NULL`

// sqlSetParentClose records child run $1's parent-close policy $2, in the
// transaction that starts it.
const sqlSetParentClose = `UPDATE relay_workflow_runs SET parent_close = $2 WHERE id = $1`

// sqlChildrenToTerminate lists run $1's unfinished children whose parent's
// end terminates them (ParentCloseTerminate).
const sqlChildrenToTerminate = `
SELECT id FROM relay_workflow_runs
WHERE parent_id = $1 AND parent_close = 'terminate' AND finished_at IS NULL
ORDER BY id`

// sqlHeartbeat records step ($1 run, $2 position, $3 key)'s heartbeat
// details $5 from attempt $4, if run job $6 still holds lease token $7
// (the job's row locked FOR SHARE until the statement commits, as
// fence.Hold does): a lost attempt records nothing, nor does an attempt
// older than the one whose details are stored (abandoned at its timeout,
// still running).
const sqlHeartbeat = `
INSERT INTO relay_workflow_heartbeats (run_id, position, key, attempt, details)
SELECT $1, $2, $3, $4, $5::jsonb
WHERE EXISTS (SELECT 1 FROM relay_jobs WHERE id = $6 AND lease_token = $7::uuid FOR SHARE)
ON CONFLICT (run_id, position) DO UPDATE
SET key = excluded.key, attempt = excluded.attempt, details = excluded.details, at = now()
WHERE relay_workflow_heartbeats.attempt <= excluded.attempt OR relay_workflow_heartbeats.key <> excluded.key`

// sqlHeartbeatDetails reads step ($1 run, $2 position, $3 key)'s latest
// heartbeat details.
const sqlHeartbeatDetails = `
SELECT details::text FROM relay_workflow_heartbeats WHERE run_id = $1 AND position = $2 AND key = $3`

// sqlInsertUpdate puts update request $2 ($3, JSON) in run $1's updates,
// if the run is not finished, and returns its id and the run's job to
// wake.
const sqlInsertUpdate = `
INSERT INTO relay_workflow_updates (run_id, name, request)
SELECT id, $2, $3::jsonb FROM relay_workflow_runs
WHERE id = $1 AND finished_at IS NULL
RETURNING id, (SELECT coalesce(job_id, 0) FROM relay_workflow_runs WHERE id = $1)`

// sqlPendingUpdate reads the oldest pending update $2 of run $1. Only the
// execution holding the run changes its updates, so a read is enough.
const sqlPendingUpdate = `
SELECT id, request::text FROM relay_workflow_updates
WHERE run_id = $1 AND name = $2 AND state = 'pending'
ORDER BY id LIMIT 1`

// sqlAnswerUpdate records the answer to pending update $1 (state $2,
// response $3, error $4), in the transaction that checkpoints the update.
// Its caller is woken after the commit (announcer): a NOTIFY here would
// serialise the commit with every other notifying one.
const sqlAnswerUpdate = `
UPDATE relay_workflow_updates
SET state = $2, response = $3::jsonb, error = nullif($4, ''), handled_at = now()
WHERE id = $1 AND state = 'pending'`

// sqlUpdateOutcome reads update $1 and whether its run has finished.
const sqlUpdateOutcome = `
SELECT u.run_id, u.name, u.state, coalesce(u.response::text, ''), coalesce(u.error, ''),
       r.finished_at IS NOT NULL, r.state
FROM relay_workflow_updates AS u JOIN relay_workflow_runs AS r ON r.id = u.run_id
WHERE u.id = $1`
