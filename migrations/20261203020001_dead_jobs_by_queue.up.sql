-- Dead jobs by queue, for the admin API's queue list (GET /v1/queues),
-- which the dashboard's overview reads every 10 seconds. Its dead count per
-- queue walked relay_jobs_finalized_idx (state, finalized_at) over every
-- dead row and read each row from the heap for its queue: 43 ms beside
-- 10,000 dead jobs, and linear in them. With the queue in a partial index
-- of dead rows alone, the count is an index-only scan. Jobs enter it only
-- when they die, so enqueues, claims and completions do not write it.
-- Built CONCURRENTLY (enqueues and claims go on meanwhile), so outside a
-- transaction; a build that failed half-way leaves an invalid index, which
-- the drop before it clears on the next run.
DROP INDEX CONCURRENTLY IF EXISTS relay_jobs_dead_idx;
--bun:split
CREATE INDEX CONCURRENTLY relay_jobs_dead_idx ON relay_jobs (queue) WHERE state = 'dead';
