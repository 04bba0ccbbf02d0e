-- A run's execution timeout (workflow.StartOpts.ExecutionTimeout): the
-- instant, on the database's clock, after which the run fails (and
-- compensates) whatever it waits on. NULL for none. Set when the run is
-- inserted; Retry clears it.
ALTER TABLE relay_workflow_runs ADD COLUMN deadline_at timestamptz;
