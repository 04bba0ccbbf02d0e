-- A run whose first execution's first write is its outcome (a child run
-- with one step, executed in its parent's slot; any run whose steps'
-- checkpoints all wait for its end) records it in one update of its row,
-- without the touch that first moves it pending -> running: the outcome's
-- statement marks it started too. pending -> failed was allowed already.
CREATE OR REPLACE FUNCTION relay_workflow_runs_check() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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
        ('pending',      'completed'),    -- completed in its first write
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
