-- Ordering keys: only the head of each key is claimable (issue 17).
--
-- Until now a queued job with an ordering key sat in the claim index and
-- the claim skipped it while an earlier job of its key was queued, claimed
-- or dead: one probe per blocked job on every claim, so a claim beside a
-- busy key walked its whole backlog, and unordered jobs queued behind it
-- paid for that (10 / 67 / 230+ ms per claim beside 1k / 10k / 100k).
--
-- Now a queued job that waits for an earlier job of its key carries
-- key_waiting, and the claim index keeps those jobs in a range of their own
-- (its second column), which the claim never enters. The rule is the one
-- the claim applied: a queued job waits while an earlier job (lower id) of
-- its key and queue is queued, claimed or dead. key_waiting is a column,
-- not a state: the state machine is unchanged.
--
-- The invariant, per (queue, ordering key): the first unfinished job (by
-- id) does not wait, and every other queued job of the key waits.
--
-- Who keeps it, and why no race leaves a key stuck:
--
--   * Every transaction that changes a key's unfinished set (a keyed
--     insert; a keyed job that finishes, is deleted, or goes back to queued)
--     re-decides the whole key at its COMMIT (deferred constraint
--     triggers), holding a per-key transaction-level advisory lock, with a
--     fresh snapshot: relay_jobs_key_fix. The lock is released after the
--     commit is visible, so of two transactions that change one key, the
--     second to fix sees everything the first committed. No decision is
--     made on a snapshot that misses a committed change of the key (the
--     race of the first attempt: a head's finish and a successor's insert
--     each deciding without seeing the other).
--   * The lock is taken at COMMIT only, never while a caller's transaction
--     is open: a completion never waits for a caller, only for another
--     commit of the same key in progress (microseconds).
--   * A transaction locks all its keys in one sorted pass (the first
--     deferred trigger of the commit does the work for all of them; the
--     keys are noted at statement time in a transaction-local setting), so
--     two transactions touching several keys cannot deadlock on the locks.
--     A transaction touching more than a few hundred keys (16 kB of them:
--     bulk loads) takes
--     one exclusive lock instead (every fixer holds it shared), and fixes
--     each row's key.
--   * An insert guesses key_waiting from what it sees (BEFORE INSERT), so
--     the fix at commit usually changes nothing.
--   * Claims (queued -> claimed), failures to dead and heartbeats change
--     no key's unfinished set and fire nothing. Jobs without a key never
--     fire any of this (the WHEN clauses test ordering_key first).
--
-- The claim keeps a check that a keyed job is its key's first unfinished
-- job (one probe of relay_jobs_ordering_idx, now made for heads only):
-- order never depends on these triggers, only the claim's cost does.

ALTER TABLE relay_jobs ADD COLUMN key_waiting boolean NOT NULL DEFAULT false;

-- Existing queued jobs behind an earlier unfinished job of their key wait.
UPDATE relay_jobs AS j SET key_waiting = true
WHERE j.ordering_key IS NOT NULL AND j.state = 'queued'
  AND EXISTS (SELECT 1 FROM relay_jobs AS e
              WHERE e.queue = j.queue AND e.ordering_key = j.ordering_key AND e.id < j.id
                AND e.state IN ('queued', 'claimed', 'dead'));

-- The claim index gains key_waiting, and relay_jobs_key_heads_idx is made,
-- in 20261201000004_key_refix, outside a transaction (CREATE INDEX
-- CONCURRENTLY: claims and enqueues go on during the builds). Until then
-- the claim filters waiting jobs out on the old index.

-- relay_jobs_key_fix(queue, key) restores the invariant for one key from
-- what is committed (and this transaction's own changes). The caller holds
-- the key's lock.
CREATE FUNCTION relay_jobs_key_fix(q text, k text) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    f record;
BEGIN
    IF q IS NULL OR k IS NULL THEN
        RETURN;
    END IF;
    SELECT id, state, key_waiting INTO f
    FROM relay_jobs
    WHERE queue = q AND ordering_key = k AND state IN ('queued', 'claimed', 'dead')
    ORDER BY id
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- The snapshot is the transaction's: a head finished by a commit
        -- it does not see would be taken for unfinished, and the jobs
        -- behind it would wait for ever. Locking the head fails with a
        -- serialization failure (to retry) when it changed since, and
        -- when another transaction is changing it now.
        BEGIN
            PERFORM 1 FROM relay_jobs WHERE id = f.id FOR NO KEY UPDATE NOWAIT;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'relay: the head of ordering key % is changing; retry the transaction', k
                USING ERRCODE = 'serialization_failure';
        END;
    END IF;
    IF f.state = 'queued' AND f.key_waiting THEN
        UPDATE relay_jobs SET key_waiting = false
        WHERE id = f.id AND state = 'queued' AND key_waiting;
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
END;
$$;

-- relay_jobs_key_note(queue, key) remembers, for this transaction, that it
-- changed the key: the setting relay.job_keys holds a JSON array of
-- {"k", "q"} objects (appended and searched as text: an object's text
-- cannot occur inside another's, whose quotes are escaped), or "all" past
-- 16 kB of keys, or "held" once "all" is locked.
CREATE FUNCTION relay_jobs_key_note(q text, k text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    cur text := current_setting('relay.job_keys', true);
    e   text;
BEGIN
    IF q IS NULL OR k IS NULL OR cur IN ('"all"', '"held"') THEN
        RETURN;
    END IF;
    e := jsonb_build_object('q', q, 'k', k)::text;
    IF cur IS NULL OR cur IN ('', '[]') THEN
        PERFORM set_config('relay.job_keys', '[' || e || ']', true);
    ELSIF strpos(cur, e) = 0 THEN
        IF length(cur) > 16384 THEN
            PERFORM set_config('relay.job_keys', '"all"', true);
        ELSE
            PERFORM set_config('relay.job_keys', left(cur, -1) || ', ' || e || ']', true);
        END IF;
    END IF;
END;
$$;

-- A keyed insert guesses whether it waits, and notes its key.
CREATE FUNCTION relay_jobs_key_before_insert() RETURNS trigger
LANGUAGE plpgsql
-- One plan for every call: a custom plan per row costs more than the probe.
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    NEW.key_waiting := NEW.state = 'queued' AND EXISTS (
        SELECT 1 FROM relay_jobs AS e
        WHERE e.queue = NEW.queue AND e.ordering_key = NEW.ordering_key AND e.id < NEW.id
          AND e.state IN ('queued', 'claimed', 'dead'));
    PERFORM relay_jobs_key_note(NEW.queue, NEW.ordering_key);
    RETURN NEW;
END;
$$;

CREATE TRIGGER relay_jobs_key_before_insert
    BEFORE INSERT ON relay_jobs
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION relay_jobs_key_before_insert();

-- A keyed update or delete that changes its key's unfinished set (or puts
-- a job back to queued) notes its key(s).
CREATE FUNCTION relay_jobs_key_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM relay_jobs_key_note(OLD.queue, OLD.ordering_key);
    IF TG_OP = 'UPDATE' THEN
        PERFORM relay_jobs_key_note(NEW.queue, NEW.ordering_key);
        RETURN NEW;
    END IF;
    RETURN OLD;
END;
$$;

-- The WHEN clauses of the noting triggers and of the deferred ones below
-- are the same, so every deferred event finds its key noted.
CREATE TRIGGER relay_jobs_key_update_note
    AFTER UPDATE OF state, queue, ordering_key ON relay_jobs
    FOR EACH ROW
    WHEN ((OLD.ordering_key IS NOT NULL OR NEW.ordering_key IS NOT NULL)
          AND (OLD.queue IS DISTINCT FROM NEW.queue
               OR OLD.ordering_key IS DISTINCT FROM NEW.ordering_key
               OR (OLD.state <> NEW.state
                   AND NOT (OLD.state = 'queued' AND NEW.state = 'claimed')
                   AND NOT (OLD.state = 'claimed' AND NEW.state = 'dead'))))
    EXECUTE FUNCTION relay_jobs_key_changed();

CREATE TRIGGER relay_jobs_key_delete_note
    AFTER DELETE ON relay_jobs
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL AND OLD.state IN ('queued', 'claimed', 'dead'))
    EXECUTE FUNCTION relay_jobs_key_changed();

-- At commit: the first deferred event of the transaction locks every noted
-- key in a sorted order (after a shared hold of the bulk lock) and fixes
-- each; the others find nothing left to do. Past 100 keys, the bulk lock
-- is taken exclusively and every event fixes its own row's key.
CREATE FUNCTION relay_jobs_key_at_commit() RETURNS trigger
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
        IF TG_OP <> 'INSERT' THEN
            PERFORM relay_jobs_key_fix(OLD.queue, OLD.ordering_key);
        END IF;
        IF TG_OP <> 'DELETE' THEN
            PERFORM relay_jobs_key_fix(NEW.queue, NEW.ordering_key);
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
        PERFORM relay_jobs_key_fix(e.q, e.k);
    END LOOP;
    RETURN NULL;
END;
$$;

CREATE CONSTRAINT TRIGGER relay_jobs_key_insert
    AFTER INSERT ON relay_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION relay_jobs_key_at_commit();

CREATE CONSTRAINT TRIGGER relay_jobs_key_update
    AFTER UPDATE OF state, queue, ordering_key ON relay_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN ((OLD.ordering_key IS NOT NULL OR NEW.ordering_key IS NOT NULL)
          AND (OLD.queue IS DISTINCT FROM NEW.queue
               OR OLD.ordering_key IS DISTINCT FROM NEW.ordering_key
               OR (OLD.state <> NEW.state
                   AND NOT (OLD.state = 'queued' AND NEW.state = 'claimed')
                   AND NOT (OLD.state = 'claimed' AND NEW.state = 'dead'))))
    EXECUTE FUNCTION relay_jobs_key_at_commit();

CREATE CONSTRAINT TRIGGER relay_jobs_key_delete
    AFTER DELETE ON relay_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL AND OLD.state IN ('queued', 'claimed', 'dead'))
    EXECUTE FUNCTION relay_jobs_key_at_commit();
