-- The admin API lists workflow runs of one state newest first (the
-- dashboard's failed runs), and counts them on the overview. Without this
-- index a page of failed runs walked relay_workflow_runs_list_idx backwards
-- past every completed run, and the count read the whole table
-- (TestWorkflowRunListUsesIndex). A run changes state a few times in its
-- life (pending → running → completed), so the index costs those updates
-- their HOT path and nothing else.
CREATE INDEX relay_workflow_runs_state_idx ON relay_workflow_runs (state, created_at, id);
