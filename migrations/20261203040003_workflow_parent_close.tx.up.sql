-- A child's parent-close policy (workflow.ChildOpts.ParentClose): NULL
-- (cancel, the default), 'abandon' (the child is no longer its parent's to
-- close: it runs on) or 'terminate' (the parent's end terminates it,
-- without its compensations; workflow.finish and workflow.Terminate do
-- that before they close the rest).
ALTER TABLE relay_workflow_runs ADD COLUMN parent_close text;

-- The tree walk of a cancel and of a parent's end, as in
-- 20261201000006_workflow_wake, but an abandoned child (and what it
-- started) is not walked into: a cancel or end of its parent leaves it be.
-- A cancel of the abandoned run itself (depth 0) is as before.
CREATE OR REPLACE FUNCTION relay_workflow_request_cancel(text, boolean) RETURNS SETOF bigint
LANGUAGE sql VOLATILE AS $$
WITH RECURSIVE tree AS (
    SELECT $1 AS id, 0 AS depth
    UNION
    SELECT c.id, tree.depth + 1 FROM relay_workflow_runs AS c JOIN tree ON c.parent_id = tree.id
    WHERE c.parent_close IS DISTINCT FROM 'abandon'
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
