-- An enqueue that is its own transaction (on a pool, not in a caller's
-- transaction) sends its wake-up after committing, from a separate
-- statement, and tells the insert trigger so with the transaction-local
-- setting relay.notify = 'after'. A NOTIFY inside the inserting transaction
-- holds PostgreSQL's global notification lock from pre-commit until the
-- commit's WAL flush, so concurrent single enqueues serialised on each
-- other's fsync (about 1,400 enqueues/s at most here); a transaction that
-- only notifies writes no WAL and holds the lock for microseconds.
-- Enqueues in a caller's transaction still notify in it, so the wake-up
-- arrives with their commit.

CREATE OR REPLACE FUNCTION relay_jobs_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted WHERE state <> 'queued') THEN
        RAISE EXCEPTION 'relay: jobs must be inserted queued'
            USING ERRCODE = 'RLY01';
    END IF;
    IF current_setting('relay.notify', true) IS DISTINCT FROM 'after' THEN
        PERFORM pg_notify('relay_jobs', q.queue)
        FROM (SELECT DISTINCT queue FROM inserted WHERE run_at <= now()) AS q;
    END IF;
    RETURN NULL;
END;
$$;
