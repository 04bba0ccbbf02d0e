-- Run tags (workflow.StartOpts.Tags, workflow.AddTags): labels people and
-- tools find runs by ("order:123", "tenant:acme"), matched by
-- workflow.ListOpts.Tags and the admin API's ?tag= filter (runs carrying
-- every tag asked for). A constant default: no table rewrite.
--
-- The GIN index holds only tagged runs. A run's updates while it executes
-- leave tags alone, so they stay HOT. This file runs outside a transaction
-- (no .tx in its name), in parts cut at the --bun:split line, so that the
-- index is built CONCURRENTLY: runs go on being started and executed
-- during the build. Each part can run again after a failure.
ALTER TABLE relay_workflow_runs ADD COLUMN IF NOT EXISTS tags text[] NOT NULL DEFAULT '{}';
--bun:split
DROP INDEX CONCURRENTLY IF EXISTS relay_workflow_runs_tags_idx;
--bun:split
CREATE INDEX CONCURRENTLY relay_workflow_runs_tags_idx ON relay_workflow_runs USING gin (tags)
    WHERE tags <> '{}';
