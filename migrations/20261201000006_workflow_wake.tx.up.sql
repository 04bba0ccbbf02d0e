-- Workflow wake-ups that cannot deadlock, and one tree walk for every
-- cancel of a run's descendants (issue 13). Replaces the body of
-- relay_workflow_job_ended (20261201000002); its trigger is unchanged.
-- See docs/workflow.md, "A run whose job ends".

-- relay_workflow_request_cancel asks the unfinished descendants of run $1
-- (and run $1 itself when $2) to cancel, and returns their jobs to wake (0
-- for a run without one). The rows are locked parents first (by depth, then
-- id), whatever the plan: a run ending cancelled locks its own row, then its
-- children's (the workflow's execution.finish), and a cancel of that run
-- must not take them the other way round. It is the one tree walk of
-- workflow.Cancel, of a run's end or ContinueAsNew (its children) and of
-- relay_workflow_job_ended. The tree starts from $1 as given (no row read),
-- so a run that does not exist has nothing to cancel.
CREATE FUNCTION relay_workflow_request_cancel(text, boolean) RETURNS SETOF bigint
LANGUAGE sql VOLATILE AS $$
WITH RECURSIVE tree AS (
    SELECT $1 AS id, 0 AS depth
    UNION
    SELECT c.id, tree.depth + 1 FROM relay_workflow_runs AS c JOIN tree ON c.parent_id = tree.id
), locked AS (
    SELECT r.id FROM relay_workflow_runs AS r JOIN tree ON r.id = tree.id
    WHERE r.finished_at IS NULL AND (tree.depth > 0 OR $2)
    ORDER BY tree.depth, r.id
    FOR NO KEY UPDATE OF r
)
UPDATE relay_workflow_runs AS r
SET cancel_requested = true
FROM locked
WHERE r.id = locked.id
RETURNING coalesce(r.job_id, 0)
$$;

-- relay_workflow_wake(jobs) makes the jobs runnable now, as core.Wake
-- does, without ever waiting for a job's row: it runs in transactions that
-- already hold a job's row or a run's (the rescuer's, the completer's or a
-- canceller's ending a run's job, a cancel, a child's end waking its
-- parent), and the row it wants can be held by a transaction waiting for
-- theirs. It is defined in 20261201000001_job_rewake, which runs before
-- this file (core's relay_jobs_wake: held rows are handed off and woken
-- once free).

-- relay_workflow_cancel_tree asks the unfinished descendants of run $1
-- (and run $1 itself when $2) to cancel (relay_workflow_request_cancel)
-- and wakes their jobs (relay_workflow_wake), returning how many runs it
-- asked: workflow.Cancel, and a run's end or ContinueAsNew closing its
-- children. Its wake-ups never wait for a job's row, as the trigger's, for the same
-- reason: a cancel holds the tree's run rows when it wakes their jobs, and a
-- child's job ending at that moment holds its job's row and asks for its
-- run's (TestCancelWhileAChildJobEnds).
CREATE FUNCTION relay_workflow_cancel_tree(text, boolean) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    jobs bigint[];
BEGIN
    SELECT array_agg(j) INTO jobs FROM relay_workflow_request_cancel($1, $2) AS j;
    PERFORM relay_workflow_wake(jobs);
    RETURN coalesce(cardinality(jobs), 0);
END;
$$;

-- A run is executed by its job (relay_workflow_runs.job_id). When that job
-- ends without the run having ended (its attempts used up by crashed or
-- failed executions, the reserve ones included: dead; or cancelled through
-- the core), nothing will execute the run again: it ends failed here, in
-- the transaction that ends the job (the rescuer's, the completer's or the
-- canceller's), so it is never left running behind a dead job. As when a
-- run ends: its Result callers are notified, its unfinished descendants
-- are asked to cancel and woken (relay_workflow_cancel_tree), and so is its
-- parent's job (relay_workflow_wake: no wait, so that a parent's job
-- and its child's ending at once cannot deadlock). Retry runs
-- such a run again with a new job. A job left behind by its run (job_id
-- moved on) changes nothing.
CREATE OR REPLACE FUNCTION relay_workflow_job_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    run        text := NEW.args->>'run_id';
    parent_job bigint;
    msg        text;
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
    PERFORM relay_workflow_cancel_tree(run, false);
    PERFORM relay_workflow_wake(ARRAY[parent_job]);
    RETURN NULL;
END;
$$;
