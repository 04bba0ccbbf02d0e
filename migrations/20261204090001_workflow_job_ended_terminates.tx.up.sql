-- A run ended by its job's end (the job dead, or cancelled behind the
-- workflow layer's back: relay_workflow_job_ended) closes its children per
-- their ChildOpts.ParentClose, as workflow.finish and workflow.Terminate
-- do: before this, the trigger asked every child but an abandoned one to
-- cancel, so a ParentCloseTerminate child ran its compensations.

-- relay_workflow_terminate_children terminates the unfinished children of
-- run $1 whose policy is 'terminate', as workflow.Terminate would each:
-- the child's row ends terminated (the same error text as the Go path's),
-- its Result callers are told, its own unfinished descendants are asked to
-- cancel (abandoned ones left be) and its terminate-policy children
-- terminated in turn, and its job is cancelled with the cancel
-- notification core.Cancel sends (its worker stops; its late writes are
-- fenced). Lock order: each child's run row, then its job's row.
CREATE OR REPLACE FUNCTION relay_workflow_terminate_children(parent text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    kid     text;
    kid_job bigint;
    token   text;
BEGIN
    FOR kid IN
        SELECT id FROM relay_workflow_runs
        WHERE parent_id = parent AND parent_close = 'terminate' AND finished_at IS NULL
        ORDER BY id
        FOR NO KEY UPDATE
    LOOP
        UPDATE relay_workflow_runs
        SET state = 'terminated', finished_at = now(),
            error = format('workflow: run %s terminated: its parent %s ended (ChildOpts.ParentClose is ParentCloseTerminate)', kid, parent)
        WHERE id = kid AND finished_at IS NULL
        RETURNING coalesce(job_id, 0) INTO kid_job;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;
        PERFORM pg_notify('relay_workflow', kid);
        PERFORM relay_workflow_cancel_tree(kid, false);
        PERFORM relay_workflow_terminate_children(kid);
        IF kid_job <> 0 THEN
            WITH old AS (SELECT id, lease_token FROM relay_jobs WHERE id = kid_job FOR UPDATE)
            UPDATE relay_jobs AS j
            SET state = 'cancelled', finalized_at = now(), lease_token = NULL, lease_expires_at = NULL
            FROM old
            WHERE j.id = old.id AND j.state IN ('queued', 'claimed')
            RETURNING coalesce(old.lease_token::text, '') INTO token;
            IF FOUND THEN
                PERFORM pg_notify('relay_control', 'cancel:' || kid_job || ':' || token);
            END IF;
        END IF;
    END LOOP;
END;
$$;

-- As in 20261201000006_workflow_wake, and the run's terminate-policy
-- children are terminated after the rest are asked to cancel.
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
    PERFORM relay_workflow_terminate_children(run);
    PERFORM relay_workflow_wake(ARRAY[parent_job]);
    RETURN NULL;
END;
$$;
