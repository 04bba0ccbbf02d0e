-- A cancel once accepted is never lost (docs/workflow.md, failure
-- semantics): a run whose cancel was requested cannot be recorded
-- completed, whoever writes the outcome. The execution's outcome statement
-- already declines to (workflow.sqlFinishRun, sqlFinishRootRun) and the
-- execution then runs the compensations and ends the run cancelled; this
-- trigger holds the rule for every other writer. Workflow.Cancel locks the
-- run's row while it sets the flag, so an outcome written at the same
-- moment either commits first (and Cancel finds the run finished) or sees
-- the flag.
--
-- A trigger of its own, with a WHEN clause: the function is called only
-- for the update it refuses, and relay_workflow_runs_check stays as it is.
CREATE FUNCTION relay_workflow_runs_cancel_wins() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'relay: workflow run %: cannot complete while a cancel is requested (it ends cancelled)', NEW.id
        USING ERRCODE = 'RLY01';
END;
$$;

CREATE TRIGGER relay_workflow_runs_cancel_wins
    BEFORE UPDATE OF state ON relay_workflow_runs
    FOR EACH ROW
    WHEN (NEW.state = 'completed' AND NEW.cancel_requested)
    EXECUTE FUNCTION relay_workflow_runs_cancel_wins();
