-- The AFTER UPDATE triggers every claim and outcome plans get small WHEN
-- clauses; what they tested beyond that moves into the row's function call.
--
-- A trigger's WHEN clause is planned again from its stored node text by
-- every statement that may fire it, about 5 µs per kB (migration
-- *_rules_cheap_per_statement). After that migration a claim or an outcome
-- still planned 7.1 kB of AFTER trigger clauses besides the state
-- machine's 6.3 kB: the ordering keys' two update triggers (2.8 kB each)
-- and relay_workflow_job_ended (1.6 kB). They now test only what rules
-- most rows out, in a few hundred bytes:
--   - the key triggers: that the row has an ordering key. For a keyed row
--     the rest of the old clause is relay_jobs_key_moved, a PL/pgSQL
--     function called from the clause (planned once per connection,
--     ~1 µs a keyed row), so the deferred trigger is queued for exactly
--     the rows it was queued for before, and every deferred event still
--     finds its key noted (both clauses stay the same);
--   - relay_workflow_job_ended: a workflow job entering dead or cancelled;
--     that the state changed is now the function's first test.
-- 2.8 -> 1.4 kB each for the key triggers, 1.6 -> 1.0 kB for the workflow
-- one: a one-job claim or outcome ~15-25 µs less of its server time
-- (docs/benchmarks.md, "The AFTER triggers' clauses").

-- relay_jobs_key_moved says whether an update of a keyed row changes which
-- job heads its key: the queue or the key changed, or the state changed
-- other than by a claim (queued>claimed) or a claimed job dying
-- (claimed>dead), which keep the head where it is.
CREATE FUNCTION relay_jobs_key_moved(old_queue text, new_queue text, old_key text, new_key text,
                                     old_state text, new_state text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN old_queue IS DISTINCT FROM new_queue
        OR old_key IS DISTINCT FROM new_key
        OR (old_state <> new_state
            AND old_state || '>' || new_state <> ALL ('{queued>claimed,claimed>dead}'::text[]));
END;
$$;

DROP TRIGGER relay_jobs_key_update_note ON relay_jobs;
CREATE TRIGGER relay_jobs_key_update_note
    AFTER UPDATE OF state, queue, ordering_key ON relay_jobs
    FOR EACH ROW
    WHEN ((OLD.ordering_key IS NOT NULL OR NEW.ordering_key IS NOT NULL)
          AND relay_jobs_key_moved(OLD.queue, NEW.queue, OLD.ordering_key, NEW.ordering_key,
                                   OLD.state, NEW.state))
    EXECUTE FUNCTION relay_jobs_key_changed();

DROP TRIGGER relay_jobs_key_update ON relay_jobs;
CREATE CONSTRAINT TRIGGER relay_jobs_key_update
    AFTER UPDATE OF state, queue, ordering_key ON relay_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN ((OLD.ordering_key IS NOT NULL OR NEW.ordering_key IS NOT NULL)
          AND relay_jobs_key_moved(OLD.queue, NEW.queue, OLD.ordering_key, NEW.ordering_key,
                                   OLD.state, NEW.state))
    EXECUTE FUNCTION relay_jobs_key_at_commit();

-- As in 20261204090001_workflow_job_ended_terminates, with the clause's
-- old test (the state changed) first.
CREATE OR REPLACE FUNCTION relay_workflow_job_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    run        text := NEW.args->>'run_id';
    parent_job bigint;
    msg        text;
BEGIN
    IF OLD.state = NEW.state OR run IS NULL THEN
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

DROP TRIGGER relay_workflow_job_ended ON relay_jobs;
CREATE TRIGGER relay_workflow_job_ended
    AFTER UPDATE OF state ON relay_jobs
    FOR EACH ROW
    WHEN (NEW.kind = 'relay.workflow' AND NEW.state = ANY ('{dead,cancelled}'::text[]))
    EXECUTE FUNCTION relay_workflow_job_ended();
