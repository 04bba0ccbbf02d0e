-- Ordering keys: keys the commit-time fix cannot settle are handed to a
-- READ COMMITTED re-fix (issue 17, review of 20261201000003_ordering_heads).
--
-- relay_jobs_key_fix decides a key from what it reads, and two cases left a
-- key's next job waiting with nobody to promote it:
--
--   * The fix ran in a REPEATABLE READ or SERIALIZABLE transaction (a
--     handler's CompleteTx, a cancel or a delete in the caller's
--     transaction). It reads that transaction's snapshot, not what is
--     committed: a job of the key enqueued and committed after the snapshot
--     is invisible to it, so finishing the head promoted nothing, and the
--     enqueuer's own fix (earlier) had seen the head still unfinished.
--   * The next job's row was locked by another transaction (core.Wake or an
--     admin retry in a caller's transaction, a user's UPDATE): the
--     promotion waited for that transaction to end, holding up the
--     finisher's commit (a completer's batch) for as long as a caller
--     cared to keep its transaction open.
--
-- Now the fix says whether it settled its key: it did, unless it ran under
-- another isolation than READ COMMITTED, or it stepped over the next job's
-- locked row (SKIP LOCKED: it never waits on a row). A key not settled is
-- handed off: a row in relay_job_key_refix, written in the fixer's
-- transaction (so it is there exactly when the change it follows is
-- committed), and a notification 'keys' on relay_control, on which the
-- clients' listeners run relay_jobs_key_refix at once. Every client's
-- rescuer runs it too (the safety net: a notification nobody heard, a row
-- still locked at the first try). relay_jobs_key_refix re-fixes each
-- handed-off key in READ COMMITTED under the key's lock, as the commit-time
-- fix does, and hands a key off again while its next row is still locked.
--
-- Nothing changes for jobs without a key, nor for keyed transactions in
-- READ COMMITTED (the default) whose next job is not locked: the hand-off
-- table is written only in the two cases above.
--
-- This file runs outside a transaction (no .tx in its name), in parts cut
-- at the --bun:split lines: this first part is one multi-statement query,
-- which PostgreSQL runs as one (implicit) transaction; then the indexes of
-- 20261201000003 are built with CREATE INDEX CONCURRENTLY, which must run
-- alone, so that claims and enqueues go on during the builds. Every part
-- can run again after a failure half-way (a build that failed leaves an
-- invalid index, dropped first).

CREATE TABLE IF NOT EXISTS relay_job_key_refix (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text NOT NULL,
    ordering_key text NOT NULL,
    noted_at     timestamptz NOT NULL DEFAULT now()
);

-- relay_jobs_key_fix(queue, key) restores the invariant for one key from
-- what it reads (committed rows and this transaction's own, under READ
-- COMMITTED), and says whether the key is settled (see above). The caller
-- holds the key's lock.
DROP FUNCTION IF EXISTS relay_jobs_key_fix(text, text);
CREATE FUNCTION relay_jobs_key_fix(q text, k text) RETURNS boolean
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    f       record;
    settled boolean := current_setting('transaction_isolation') = 'read committed';
BEGIN
    IF q IS NULL OR k IS NULL THEN
        RETURN true;
    END IF;
    SELECT id, state, key_waiting INTO f
    FROM relay_jobs
    WHERE queue = q AND ordering_key = k AND state IN ('queued', 'claimed', 'dead')
    ORDER BY id
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN settled;
    END IF;
    IF NOT settled THEN
        -- The snapshot is the transaction's: a head finished by a commit
        -- it does not see would be taken for unfinished, and the jobs
        -- behind it would wait for ever. Locking the head fails with a
        -- serialization failure (to retry) when it changed since, and
        -- when another transaction is changing it now. (A job committed
        -- since is not seen at all: the hand-off covers that.)
        BEGIN
            PERFORM 1 FROM relay_jobs WHERE id = f.id FOR NO KEY UPDATE NOWAIT;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'relay: the head of ordering key % is changing; retry the transaction', k
                USING ERRCODE = 'serialization_failure';
        END;
    END IF;
    IF f.state = 'queued' AND f.key_waiting THEN
        -- Never wait on the row: a transaction holding it may stay open
        -- as long as its caller likes. Stepped over, the key is handed off.
        UPDATE relay_jobs SET key_waiting = false
        WHERE id IN (
            SELECT id FROM relay_jobs
            WHERE id = f.id AND state = 'queued' AND key_waiting
            FOR NO KEY UPDATE SKIP LOCKED)
          AND state = 'queued' AND key_waiting;
        IF NOT FOUND THEN
            settled := false;
        END IF;
    END IF;
    -- Later jobs that do not wait (inserted beside an earlier job not yet
    -- committed, or behind a job requeued since) wait now. A row another
    -- transaction holds is stepped over: a claim is taking it, or a
    -- transaction changing it fixes the key at its own commit. Order does
    -- not rest on this (the claim probes a head's key); only the claim's
    -- cost would.
    UPDATE relay_jobs SET key_waiting = true
    WHERE id IN (
        SELECT id FROM relay_jobs
        WHERE queue = q AND ordering_key = k AND ordering_key IS NOT NULL
          AND state = 'queued' AND NOT key_waiting AND id > f.id
        FOR NO KEY UPDATE SKIP LOCKED)
      AND state = 'queued' AND NOT key_waiting;
    RETURN settled;
END;
$$;

-- relay_jobs_key_hand_off(queue, key) hands a key its fix did not settle
-- to relay_jobs_key_refix, from this transaction's commit on.
CREATE OR REPLACE FUNCTION relay_jobs_key_hand_off(q text, k text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- No unique key: ON CONFLICT under REPEATABLE READ fails on a row
    -- committed since the snapshot. The re-fix takes duplicates together.
    INSERT INTO relay_job_key_refix (queue, ordering_key) VALUES (q, k);
    PERFORM pg_notify('relay_control', 'keys');
END;
$$;

-- As in 20261201000003, with the keys not settled handed off.
CREATE OR REPLACE FUNCTION relay_jobs_key_at_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    cur text := current_setting('relay.job_keys', true);
    e   record;
BEGIN
    IF cur = '"all"' THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('relay_jobs|ordering keys', 0));
        PERFORM set_config('relay.job_keys', '"held"', true);
        cur := '"held"';
    END IF;
    IF cur = '"held"' THEN
        IF TG_OP <> 'INSERT' AND NOT relay_jobs_key_fix(OLD.queue, OLD.ordering_key) THEN
            PERFORM relay_jobs_key_hand_off(OLD.queue, OLD.ordering_key);
        END IF;
        IF TG_OP <> 'DELETE' AND NOT relay_jobs_key_fix(NEW.queue, NEW.ordering_key) THEN
            PERFORM relay_jobs_key_hand_off(NEW.queue, NEW.ordering_key);
        END IF;
        RETURN NULL;
    END IF;
    IF cur IS NULL OR cur IN ('', '[]') THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('relay.job_keys', '[]', true);
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('relay_jobs|ordering keys', 0));
    FOR e IN
        SELECT x->>'q' AS q, x->>'k' AS k,
               hashtextextended('relay_jobs|' || (x->>'q') || '|' || (x->>'k'), 0) AS lock
        FROM jsonb_array_elements(cur::jsonb) AS x
        ORDER BY 3
    LOOP
        PERFORM pg_advisory_xact_lock(e.lock);
        IF NOT relay_jobs_key_fix(e.q, e.k) THEN
            PERFORM relay_jobs_key_hand_off(e.q, e.k);
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

-- relay_jobs_key_refix(n) takes up to n hand-offs (the oldest; rows another
-- re-fix holds are stepped over) and re-fixes their keys in READ COMMITTED,
-- each under its key's lock, taken in one sorted pass as at commit. A key
-- whose next row is still locked is handed off again (no notification: the
-- rescuer's next run takes it). taken counts the hand-offs taken, left the
-- keys handed off again.
CREATE OR REPLACE FUNCTION relay_jobs_key_refix(n integer, OUT taken integer, OUT "left" integer)
LANGUAGE plpgsql AS $$
DECLARE
    e record;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'relay_jobs_key_refix runs in READ COMMITTED only (it reads what is committed)';
    END IF;
    taken := 0;
    "left" := 0;
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('relay_jobs|ordering keys', 0));
    FOR e IN
        WITH t AS (
            DELETE FROM relay_job_key_refix
            WHERE id IN (SELECT id FROM relay_job_key_refix ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED)
            RETURNING queue, ordering_key)
        SELECT queue AS q, ordering_key AS k, count(*) AS rows,
               hashtextextended('relay_jobs|' || queue || '|' || ordering_key, 0) AS lock
        FROM t
        GROUP BY queue, ordering_key
        ORDER BY 4
    LOOP
        taken := taken + e.rows;
        PERFORM pg_advisory_xact_lock(e.lock);
        IF NOT relay_jobs_key_fix(e.q, e.k) THEN
            INSERT INTO relay_job_key_refix (queue, ordering_key) VALUES (e.q, e.k);
            "left" := "left" + 1;
        END IF;
    END LOOP;
END;
$$;
--bun:split
-- The claim reads (queue, false, ...) in priority, run_at, id order and
-- never steps on a waiting job. The predicate stays state = 'queued', so
-- every other query of queued jobs (admin lists and counts, queue depths)
-- is served as before. Built under another name, then swapped in. A run
-- that stopped during the swap — the old index dropped, or left invalid by
-- a DROP INDEX CONCURRENTLY that failed half-way, and the new one not yet
-- renamed — finishes the swap first (the invalid one set aside and dropped),
-- so that a run again never drops a valid claim index without a valid one
-- in its place.
DO $$
BEGIN
    IF NOT coalesce((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('relay_jobs_claim_idx')), false)
       AND coalesce((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('relay_jobs_claim_idx_heads')), false) THEN
        IF to_regclass('relay_jobs_claim_idx') IS NOT NULL THEN
            ALTER INDEX relay_jobs_claim_idx RENAME TO relay_jobs_claim_idx_old;
        END IF;
        ALTER INDEX relay_jobs_claim_idx_heads RENAME TO relay_jobs_claim_idx;
    END IF;
END;
$$;
--bun:split
DROP INDEX CONCURRENTLY IF EXISTS relay_jobs_claim_idx_old;
--bun:split
DROP INDEX CONCURRENTLY IF EXISTS relay_jobs_claim_idx_heads;
--bun:split
CREATE INDEX CONCURRENTLY relay_jobs_claim_idx_heads ON relay_jobs (queue, key_waiting, priority, run_at, id)
    WHERE state = 'queued';
--bun:split
DROP INDEX CONCURRENTLY IF EXISTS relay_jobs_claim_idx;
--bun:split
ALTER INDEX relay_jobs_claim_idx_heads RENAME TO relay_jobs_claim_idx;
--bun:split
-- The queued jobs of each key that do not wait: normally one (the head),
-- so the fix finds a key's wrongly claimable jobs without reading its
-- backlog.
DROP INDEX CONCURRENTLY IF EXISTS relay_jobs_key_heads_idx;
--bun:split
CREATE INDEX CONCURRENTLY relay_jobs_key_heads_idx ON relay_jobs (queue, ordering_key, id)
    WHERE ordering_key IS NOT NULL AND state = 'queued' AND NOT key_waiting;
