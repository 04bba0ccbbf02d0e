-- Wake-ups that never wait for a job's row.
--
-- A wake-up (run_at moved to now, as core.Wake does) made by a transaction
-- that already holds other rows — a completer's or rescuer's batch ending
-- a workflow's job (trigger relay_workflow_job_ended), workflow.Cancel
-- holding a run tree's rows, a child's end waking its parent — must not
-- wait for the woken job's row: the row's holder may be waiting for one of
-- ours (a deadlock), or be a caller's open transaction (an unbounded wait).
-- (It runs before 20261201000002 and 20261201000006, whose trigger and
-- functions call relay_workflow_wake.)
--
--   relay_jobs_wake(ids, notify) wakes the jobs whose rows are free in one
--   statement (FOR UPDATE SKIP LOCKED) and hands off the others: a row in
--   relay_job_rewake per job, written in the caller's transaction (so it
--   exists exactly when the caller's change is committed), and, when
--   notify, one 'wakes' notification on relay_control. A client's listener
--   runs relay_jobs_rewake at once on it; every client's hand-off loop also
--   runs it periodically (core, refixLoop), for jobs whose rows were still
--   held then. A job that is no longer claimed or queued when the re-wake
--   comes (its holder ended it) needs nothing.
--
-- relay_workflow_wake (the workflow layer's wake-up) becomes
-- relay_jobs_wake.

CREATE TABLE relay_job_rewake (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id   bigint NOT NULL,
    noted_at timestamptz NOT NULL DEFAULT now()
);

-- relay_jobs_wake wakes jobs $1 that are claimed or queued, without
-- waiting for any row, and returns how many it handed off.
CREATE FUNCTION relay_jobs_wake(ids bigint[], notify boolean) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    woken  bigint[] := '{}';
    job    bigint;
    q      text;
    handed integer;
BEGIN
    FOR job, q IN
        UPDATE relay_jobs AS j
        SET run_at = CASE WHEN j.state = 'claimed' OR j.run_at > clock_timestamp() THEN clock_timestamp() ELSE j.run_at END
        WHERE j.id IN (SELECT f.id FROM relay_jobs AS f WHERE f.id = ANY (ids) AND f.state IN ('claimed', 'queued')
                       FOR UPDATE SKIP LOCKED)
        RETURNING j.id, CASE WHEN j.state = 'queued' THEN j.queue END
    LOOP
        woken := woken || job;
        IF q IS NOT NULL THEN
            PERFORM pg_notify('relay_jobs', q);
        END IF;
    END LOOP;
    -- The rest, as this statement's snapshot last saw them: claimed or
    -- queued rows were held by another transaction (SKIP LOCKED stepped
    -- over them), and are handed off.
    INSERT INTO relay_job_rewake (job_id)
    SELECT f.id FROM relay_jobs AS f
    WHERE f.id = ANY (ids) AND NOT f.id = ANY (woken) AND f.state IN ('claimed', 'queued');
    GET DIAGNOSTICS handed = ROW_COUNT;
    IF handed > 0 AND notify THEN
        PERFORM pg_notify('relay_control', 'wakes');
    END IF;
    RETURN handed;
END;
$$;

-- relay_jobs_rewake(n) takes up to n hand-offs (the oldest; rows another
-- re-wake holds are stepped over) and makes their wake-ups; a job whose
-- row is still held is handed off again without a notification (the hand-
-- off loop's next periodic run takes it). taken counts the hand-offs taken,
-- left the jobs handed off again.
CREATE FUNCTION relay_jobs_rewake(n integer, OUT taken integer, OUT "left" integer)
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
BEGIN
    WITH t AS (
        DELETE FROM relay_job_rewake
        WHERE id IN (SELECT id FROM relay_job_rewake ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED)
        RETURNING job_id)
    SELECT array_agg(DISTINCT job_id), count(*) INTO ids, taken FROM t;
    "left" := 0;
    IF ids IS NOT NULL THEN
        "left" := relay_jobs_wake(ids, false);
    END IF;
END;
$$;

-- The workflow layer's wake-up (trigger relay_workflow_job_ended,
-- relay_workflow_cancel_tree, a child's end waking its parent) never waits.
CREATE OR REPLACE FUNCTION relay_workflow_wake(bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM relay_jobs_wake($1, true);
END;
$$;
