-- A cancel once accepted is never lost, also when it meets a failed run
-- compensating: the run ends cancelled once its compensations ran, not
-- compensated. The execution's outcome statement declines a compensated
-- end while a cancel is requested (workflow.sqlFinishRun,
-- sqlFinishRootRun) and ends the run cancelled instead; the trigger now
-- holds that rule for every other writer too, beside the completed one.
CREATE OR REPLACE FUNCTION relay_workflow_runs_cancel_wins() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'relay: workflow run %: cannot end % while a cancel is requested (it ends cancelled)', NEW.id, NEW.state
        USING ERRCODE = 'RLY01';
END;
$$;

DROP TRIGGER relay_workflow_runs_cancel_wins ON relay_workflow_runs;
CREATE TRIGGER relay_workflow_runs_cancel_wins
    BEFORE UPDATE OF state ON relay_workflow_runs
    FOR EACH ROW
    WHEN (NEW.state IN ('completed', 'compensated') AND NEW.cancel_requested)
    EXECUTE FUNCTION relay_workflow_runs_cancel_wins();
