-- The audit of `relay prove queue`, run after every job is final. Each query
-- returns one number; the summary line prints them. Tables:
--   relay_jobs      the queue itself
--   prove_attempts  one row per handler start, written on the handler's own
--                   connection before the work (committed whatever happens);
--                   ended_at is set when the handler returns
--   prove_effects   the job's effect, written in the transaction that records
--                   the job's success (core.CompleteTx)
--   prove_kills     when each worker process was sent SIGKILL

-- name: jobs
SELECT count(*) FROM relay_jobs WHERE kind = 'prove.job';

-- name: succeeded
SELECT count(*) FROM relay_jobs WHERE kind = 'prove.job' AND state = 'succeeded';

-- name: dead
SELECT count(*) FROM relay_jobs WHERE kind = 'prove.job' AND state = 'dead';

-- lost: a job not in a final state, or one that succeeded without its effect.
-- name: lost
SELECT count(*)
FROM relay_jobs j
WHERE j.kind = 'prove.job'
  AND (j.state NOT IN ('succeeded', 'dead', 'cancelled')
       OR (j.state = 'succeeded' AND NOT EXISTS (SELECT 1 FROM prove_effects e WHERE e.job_id = j.id)));

-- duplicate_effects: effect rows beyond one per job.
-- name: duplicate_effects
SELECT count(*) - count(DISTINCT job_id) FROM prove_effects;

-- overlapping_executions: pairs of attempts of one job whose execution
-- windows overlap. An attempt executes from its handler's start until the
-- first of: its handler's end; the SIGKILL of its process; the moment the
-- rescuer ended its lease (after that every write it tries is fenced, and a
-- paused worker that wakes up can record nothing). An attempt with none of
-- these is treated as still running, so it overlaps anything after it.
-- name: overlapping_executions
WITH windows AS (
    SELECT a.job_id, a.id, a.started_at,
           coalesce(least(
               a.ended_at,
               (SELECT min(k.at) FROM prove_kills k WHERE k.worker = a.worker AND k.at >= a.started_at),
               (SELECT min((h->>'finished_at')::timestamptz)
                FROM relay_jobs j, jsonb_array_elements(j.history) h
                WHERE j.id = a.job_id AND h->>'worker' = a.worker
                  AND (h->>'attempt')::int = a.attempt AND h->>'error' = 'lease expired')
           ), 'infinity') AS ended_at
    FROM prove_attempts a
)
SELECT count(*)
FROM windows a
JOIN windows b ON a.job_id = b.job_id AND a.id < b.id
WHERE a.started_at < b.ended_at AND b.started_at < a.ended_at;

-- fenced_attempts is not an error: attempts that ran past the end of
-- their lease (a paused worker) and so had their result refused by the fence.
-- name: fenced_attempts
SELECT count(*)
FROM prove_attempts a
WHERE NOT EXISTS (SELECT 1 FROM prove_effects e WHERE e.attempt_id = a.id)
  AND EXISTS (SELECT 1 FROM relay_jobs j, jsonb_array_elements(j.history) h
              WHERE j.id = a.job_id AND h->>'worker' = a.worker
                AND (h->>'attempt')::int = a.attempt AND h->>'error' = 'lease expired')
  AND a.ended_at IS NOT NULL;

-- re_executions: handler starts beyond one per job (the at-least-once count).
-- name: re_executions
SELECT count(*) - count(DISTINCT job_id) FROM prove_attempts;
