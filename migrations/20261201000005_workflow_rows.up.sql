-- Fewer writes per workflow checkpoint.
--
-- A step row no longer references its run with a foreign key: the key's
-- check locked the run row (FOR KEY SHARE, a WAL record and a dirtied page)
-- in every checkpoint transaction, and nothing needs it. A step is written
-- only under its run job's lease (relay_hold_lease), by the execution of a
-- run that exists; deleting a run still deletes its steps in the same
-- transaction, by trigger relay_workflow_runs_deleted.
--
-- This file runs outside a transaction (no .tx in its name), in parts cut
-- at the --bun:split lines, so that the indexes are built CONCURRENTLY:
-- workflow runs go on during the builds (in a transaction, DROP INDEX
-- held relay_workflow_runs' exclusive lock through both builds and the
-- backfill). The first part is one implicit transaction. Every part can
-- run again after a failure half-way.
ALTER TABLE relay_workflow_steps DROP CONSTRAINT IF EXISTS relay_workflow_steps_run_id_fkey;

CREATE OR REPLACE FUNCTION relay_workflow_runs_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM relay_workflow_steps WHERE run_id = OLD.id;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS relay_workflow_runs_deleted ON relay_workflow_runs;
CREATE TRIGGER relay_workflow_runs_deleted
    AFTER DELETE ON relay_workflow_runs
    FOR EACH ROW
    EXECUTE FUNCTION relay_workflow_runs_deleted();

-- The run row's first update of each execution (pending -> running, the
-- start time, the execution count) is a HOT update: no index holds the
-- columns it changes, and pages keep room for the new version. The state
-- index relay_workflow_runs_state_idx made it, and the outcome's update,
-- insert a new entry in every index of the table. The admin API's lists and
-- counts by state read two partial indexes instead, whose columns a run's
-- execution does not change until it ends: the unfinished runs (pending,
-- running, compensating) and the runs that ended with an error (failed,
-- compensated, cancelled: every such run has one, see workflow.finish).
ALTER TABLE relay_workflow_runs SET (fillfactor = 70);
UPDATE relay_workflow_runs SET error = format('workflow: run %s ended %s', id, state)
WHERE state IN ('failed', 'compensated', 'cancelled') AND error IS NULL;
--bun:split
DROP INDEX CONCURRENTLY IF EXISTS relay_workflow_runs_unfinished_idx;
--bun:split
CREATE INDEX CONCURRENTLY relay_workflow_runs_unfinished_idx ON relay_workflow_runs (created_at, id) WHERE finished_at IS NULL;
--bun:split
DROP INDEX CONCURRENTLY IF EXISTS relay_workflow_runs_error_idx;
--bun:split
CREATE INDEX CONCURRENTLY relay_workflow_runs_error_idx ON relay_workflow_runs (created_at, id) WHERE error IS NOT NULL;
--bun:split
DROP INDEX CONCURRENTLY IF EXISTS relay_workflow_runs_state_idx;
