-- Fewer writes per workflow checkpoint.
--
-- A step row no longer references its run with a foreign key: the key's
-- check locked the run row (FOR KEY SHARE, a WAL record and a dirtied page)
-- in every checkpoint transaction, and nothing needs it. A step is written
-- only under its run job's lease (relay_hold_lease), by the execution of a
-- run that exists; deleting a run still deletes its steps in the same
-- transaction, by trigger relay_workflow_runs_deleted.
ALTER TABLE relay_workflow_steps DROP CONSTRAINT relay_workflow_steps_run_id_fkey;

CREATE FUNCTION relay_workflow_runs_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM relay_workflow_steps WHERE run_id = OLD.id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER relay_workflow_runs_deleted
    AFTER DELETE ON relay_workflow_runs
    FOR EACH ROW
    EXECUTE FUNCTION relay_workflow_runs_deleted();
