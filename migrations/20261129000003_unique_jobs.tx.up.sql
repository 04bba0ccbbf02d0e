-- Unique jobs: a job enqueued with a unique key is not inserted while
-- another job with the same key is in one of the states it names; the
-- enqueue returns that job instead.
--
-- unique_states always includes queued and claimed (core validates it), so
-- no retry, rescue or release can move a job into the unique set: only
-- Requeue of a finished job can, and it reports the conflict.

ALTER TABLE relay_jobs
    ADD COLUMN unique_key    text,
    ADD COLUMN unique_states text[],
    ADD CONSTRAINT relay_jobs_unique_key_has_states
        CHECK ((unique_key IS NULL) = (unique_states IS NULL));

-- The guarantee, race-free across processes: at most one job per key among
-- the jobs whose state is in their own unique_states.
CREATE UNIQUE INDEX relay_jobs_unique_idx ON relay_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state = ANY (unique_states);
