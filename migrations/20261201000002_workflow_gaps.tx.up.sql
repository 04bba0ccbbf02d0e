-- Workflow gaps (issue 13): per-attempt step timing, and a run whose job
-- ends without it (dead, cancelled) ends failed. See docs/workflow.md.

-- Each step attempt's start, end and error, the latest 20 (oldest first):
-- [{"attempt": 1, "started_at": ..., "finished_at": ..., "error": "..."}].
-- Written with the step's checkpoint, in the same statement; timed on the
-- executing worker's clock. A constant default: no table rewrite.
ALTER TABLE relay_workflow_steps ADD COLUMN attempt_log jsonb NOT NULL DEFAULT '[]';

-- A run is executed by its job (relay_workflow_runs.job_id). When that job
-- ends without the run having ended (its attempts used up by crashed or
-- failed executions, the reserve ones included: dead; or cancelled through
-- the core), nothing will execute the run again: it ends failed here, in
-- the transaction that ends the job (the rescuer's, the completer's or the
-- canceller's), so it is never left running behind a dead job. As when a
-- run ends: its Result callers are notified, its parent's job is woken, and
-- its unfinished children are asked to cancel and woken (the wake-up is
-- core.Wake's: keep the two in step). Retry runs such a run again with a
-- new job. A job left behind by its run (job_id moved on) changes nothing.
CREATE FUNCTION relay_workflow_job_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    run        text := NEW.args->>'run_id';
    parent_job bigint;
    jobs       bigint[];
    msg        text;
    q          text;
BEGIN
    IF run IS NULL THEN
        RETURN NULL;
    END IF;
    IF NEW.state = 'dead' THEN
        -- last_error is cut to 1,500 characters (6,000 bytes at most), so
        -- the message stays within workflow.MaxErrorBytes (8 KiB).
        msg := format('workflow: run %s: %s executions crashed or failed, and its job %s is dead (last: %s)',
            run, NEW.attempt, NEW.id, left(coalesce(NEW.last_error, 'unknown'), 1500));
    ELSE
        msg := format('workflow: run %s: its job %s was cancelled, so nothing executes the run (cancel a run with workflow.Cancel; workflow.Retry runs it again)',
            run, NEW.id);
    END IF;
    UPDATE relay_workflow_runs AS r
    SET state = 'failed', error = msg, finished_at = now()
    WHERE r.id = run AND r.job_id = NEW.id AND r.finished_at IS NULL
    RETURNING coalesce((SELECT p.job_id FROM relay_workflow_runs AS p
                        WHERE p.id = r.parent_id AND p.finished_at IS NULL), 0)
    INTO parent_job;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('relay_workflow', run);
    -- The children, parents first (the lock order of sqlRequestCancel).
    WITH RECURSIVE tree AS (
        SELECT id, 1 AS depth FROM relay_workflow_runs WHERE parent_id = run
        UNION
        SELECT c.id, tree.depth + 1 FROM relay_workflow_runs AS c JOIN tree ON c.parent_id = tree.id
    ), locked AS (
        SELECT r.id FROM relay_workflow_runs AS r JOIN tree ON r.id = tree.id
        WHERE r.finished_at IS NULL
        ORDER BY tree.depth, r.id
        FOR NO KEY UPDATE OF r
    ), asked AS (
        UPDATE relay_workflow_runs AS r
        SET cancel_requested = true
        FROM locked
        WHERE r.id = locked.id
        RETURNING r.job_id
    )
    SELECT array_agg(job_id) INTO jobs FROM asked WHERE job_id IS NOT NULL;
    jobs := array_append(coalesce(jobs, '{}'), parent_job);
    FOR q IN
        UPDATE relay_jobs
        SET run_at = CASE WHEN state = 'claimed' OR run_at > clock_timestamp() THEN clock_timestamp() ELSE run_at END
        WHERE id = ANY (jobs) AND state IN ('claimed', 'queued')
        RETURNING CASE WHEN state = 'queued' THEN queue END
    LOOP
        IF q IS NOT NULL THEN
            PERFORM pg_notify('relay_jobs', q);
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

CREATE TRIGGER relay_workflow_job_ended
    AFTER UPDATE OF state ON relay_jobs
    FOR EACH ROW
    WHEN (NEW.state IN ('dead', 'cancelled') AND OLD.state IS DISTINCT FROM NEW.state AND NEW.kind = 'relay.workflow')
    EXECUTE FUNCTION relay_workflow_job_ended();
