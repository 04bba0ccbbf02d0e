-- Terminate (workflow.Terminate, the admin API's terminate): a run can end
-- terminated from any unfinished state, at once and without running its
-- compensations. The run state machine gains that final state and its
-- three transitions (keep in step with docs/workflow.md and
-- workflow/state.go); the rest is as before.
CREATE OR REPLACE FUNCTION relay_workflow_runs_check() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state NOT IN ('pending', 'running', 'compensating', 'completed', 'failed', 'compensated', 'cancelled', 'terminated') THEN
        RAISE EXCEPTION 'relay: workflow run %: unknown state %', NEW.id, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'pending' THEN
            RAISE EXCEPTION 'relay: workflow runs must be inserted pending'
                USING ERRCODE = 'RLY01';
        END IF;
    ELSIF OLD.state IS DISTINCT FROM NEW.state AND (OLD.state, NEW.state) NOT IN (
        ('pending',      'running'),      -- first execution
        ('pending',      'failed'),       -- could not start (executions crashed)
        ('pending',      'cancelled'),    -- cancelled before it ran
        ('pending',      'terminated'),   -- terminated before it ran
        ('running',      'completed'),    -- the function returned
        ('running',      'failed'),       -- failed, nothing to compensate
        ('running',      'compensating'), -- failed or cancelled, undoing
        ('running',      'cancelled'),    -- cancelled, nothing to compensate
        ('running',      'terminated'),   -- terminated: nothing undone
        ('compensating', 'compensated'),  -- failed and undone
        ('compensating', 'cancelled'),    -- cancelled and undone
        ('compensating', 'failed'),       -- a compensation failed
        ('compensating', 'terminated'),   -- terminated: the undoing stops
        ('failed',       'pending')       -- retry from the failed step
    ) THEN
        RAISE EXCEPTION 'relay: illegal workflow run state transition % -> % (run %)',
            OLD.state, NEW.state, OLD.id
            USING ERRCODE = 'RLY01';
    END IF;
    IF (NEW.state IN ('completed', 'failed', 'compensated', 'cancelled', 'terminated')) <> (NEW.finished_at IS NOT NULL) THEN
        RAISE EXCEPTION 'relay: workflow run %: finished_at is set exactly while the run is final', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;
