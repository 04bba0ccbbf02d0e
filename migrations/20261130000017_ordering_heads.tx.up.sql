-- Ordering keys: only the head of each key is claimable (issue 17).
--
-- Until now a queued job with an ordering key sat in the claim index and
-- the claim skipped it while an earlier job of its key was queued, claimed
-- or dead: one probe per blocked job on every claim, and unordered jobs
-- queued behind a busy key paid for walking its whole backlog (10 / 67 /
-- 230-270 ms per claim beside 1k / 10k / 100k blocked jobs).
--
-- Now a job that waits for an earlier job of its key is marked key_waiting,
-- which the claim index holds apart (its second column): the claim walks no
-- blocked job and probes nothing. The rule is unchanged: a
-- queued job waits while an earlier job (lower id) of its key and queue is
-- queued, claimed or dead. key_waiting is a column, not a state: the state
-- machine is unchanged, and jobs without a key never touch any of this (the
-- triggers below fire only for rows with an ordering key).
--
-- Who maintains it, and why nothing is lost under concurrency:
--
--   * An insert computes key_waiting from the rows it sees (a BEFORE trigger,
--     for keyed rows only).
--   * A job leaving the key's unfinished set (succeeded, cancelled, deleted)
--     settles its key at commit: the key's first unfinished job, if it is
--     queued and waiting, stops waiting.
--   * A waiting job, at the commit of the transaction that made it wait
--     (its insert, its requeue), checks again with a fresh snapshot and
--     holds the key's head until that commit by updating it (a no-op
--     update). The head's finish — which runs the settle — updates that
--     row too, so of the two transactions one waits for the other's
--     commit, and the later one sees the earlier: either the settle sees
--     the new job, or the check sees the head finished and makes the new
--     job the head itself. The wait is for a commit in progress only (the
--     check runs as a deferred trigger, at COMMIT), never for a caller's
--     open transaction: no completion, failure or heartbeat waits on a
--     caller. Under REPEATABLE READ or SERIALIZABLE the same conflict is a
--     serialization failure of the later transaction (to retry), never a
--     job left waiting.
--   * Requeueing a dead or cancelled job puts it back in line: it waits if
--     an earlier job of its key is unfinished, and the later queued jobs of
--     its key wait behind it.
--
-- Several waiting jobs inserted by one transaction (the outbox's batches)
-- check once: a job whose nearest earlier unfinished job was written by
-- the same transaction leaves the check to it.
--
-- A transaction that holds the heads of several keys at its commit, racing
-- a completion batch of the same heads in the other order, can deadlock
-- for the moment of the commit; PostgreSQL breaks it (40P01) and the loser
-- retries (the client's completer retries on its own). Rare: both must
-- touch two heads of the same keys within the same commit window.

ALTER TABLE relay_jobs ADD COLUMN key_waiting boolean NOT NULL DEFAULT false;

-- Existing queued jobs behind an earlier unfinished job of their key wait.
UPDATE relay_jobs AS j SET key_waiting = true
WHERE j.ordering_key IS NOT NULL AND j.state = 'queued'
  AND EXISTS (SELECT 1 FROM relay_jobs AS e
              WHERE e.queue = j.queue AND e.ordering_key = j.ordering_key AND e.id < j.id
                AND e.state IN ('queued', 'claimed', 'dead'));

-- The claim index puts a queue's waiting jobs in a range of their own: the
-- claim reads (queue, false, ...) in priority, run_at, id order and never
-- steps on one. Its predicate stays state = 'queued', so every other query
-- of queued jobs (admin lists and counts, queue depths) is served as before.
DROP INDEX relay_jobs_claim_idx;
CREATE INDEX relay_jobs_claim_idx ON relay_jobs (queue, key_waiting, priority, run_at, id)
    WHERE state = 'queued';

-- A keyed insert waits if an earlier job of its key is unfinished (rows
-- inserted earlier by the same statement included).
CREATE FUNCTION relay_jobs_key_before_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.key_waiting := EXISTS (
        SELECT 1 FROM relay_jobs AS e
        WHERE e.queue = NEW.queue AND e.ordering_key = NEW.ordering_key AND e.id < NEW.id
          AND e.state IN ('queued', 'claimed', 'dead'));
    RETURN NEW;
END;
$$;

CREATE TRIGGER relay_jobs_key_before_insert
    BEFORE INSERT ON relay_jobs
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION relay_jobs_key_before_insert();

-- relay_jobs_key_settle(queue, key) makes the key's first unfinished job
-- claimable if it is queued and waiting. Under READ COMMITTED an update
-- that loses a race (the job was cancelled meanwhile) finds nothing and
-- the next round reads afresh.
CREATE FUNCTION relay_jobs_key_settle(q text, k text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    h record;
BEGIN
    FOR i IN 1..100 LOOP
        SELECT id, state, key_waiting INTO h
        FROM relay_jobs
        WHERE queue = q AND ordering_key = k AND state IN ('queued', 'claimed', 'dead')
        ORDER BY id
        LIMIT 1;
        IF NOT FOUND OR h.state <> 'queued' OR NOT h.key_waiting THEN
            RETURN;
        END IF;
        UPDATE relay_jobs SET key_waiting = false
        WHERE id = h.id AND state = 'queued' AND key_waiting;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
    -- Not reached in practice; a completion is never failed for it.
END;
$$;

-- relay_jobs_key_place(id) runs at the commit of a transaction that made
-- queued job id wait (or requeued it): it waits only if an earlier job of
-- its key is still unfinished, whose row it then holds until the commit
-- (see the top of this file).
CREATE FUNCTION relay_jobs_key_place(job bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    j  record;
    h  record;
    me text := (txid_current() % 4294967296)::text;
BEGIN
    SELECT id, queue, ordering_key, state, key_waiting INTO j FROM relay_jobs WHERE id = job;
    IF NOT FOUND OR j.state <> 'queued' OR j.ordering_key IS NULL THEN
        RETURN;
    END IF;
    -- The nearest earlier unfinished job: written by this transaction, it
    -- cannot finish before this commit, and its own check (or this
    -- transaction's hold on it) covers this one.
    SELECT id, xmin::text AS xmin INTO h
    FROM relay_jobs
    WHERE queue = j.queue AND ordering_key = j.ordering_key AND id < j.id
      AND state IN ('queued', 'claimed', 'dead')
    ORDER BY id DESC
    LIMIT 1;
    IF FOUND AND h.xmin = me THEN
        IF NOT j.key_waiting THEN
            UPDATE relay_jobs SET key_waiting = true WHERE id = j.id;
        END IF;
        RETURN;
    END IF;
    FOR i IN 1..100 LOOP
        SELECT id, xmin::text AS xmin INTO h
        FROM relay_jobs
        WHERE queue = j.queue AND ordering_key = j.ordering_key AND id < j.id
          AND state IN ('queued', 'claimed', 'dead')
        ORDER BY id
        LIMIT 1;
        IF NOT FOUND THEN
            IF j.key_waiting THEN
                UPDATE relay_jobs SET key_waiting = false WHERE id = j.id;
            END IF;
            RETURN;
        END IF;
        IF NOT j.key_waiting THEN
            UPDATE relay_jobs SET key_waiting = true WHERE id = j.id;
            j.key_waiting := true;
        END IF;
        IF h.xmin = me THEN
            RETURN;
        END IF;
        -- Hold the head until this commit. Under READ COMMITTED, a head
        -- finished meanwhile matches no more and the next round reads
        -- afresh.
        UPDATE relay_jobs SET key_waiting = key_waiting
        WHERE id = h.id AND state IN ('queued', 'claimed', 'dead');
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'relay: could not place job % behind its ordering key (kept changing)', job;
END;
$$;

-- The deferred triggers' function: what changed decides what to do.
CREATE FUNCTION relay_jobs_key_at_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    cur record;
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM relay_jobs_key_settle(OLD.queue, OLD.ordering_key);
        RETURN NULL;
    END IF;
    SELECT id, queue, ordering_key, state INTO cur FROM relay_jobs WHERE id = NEW.id;
    IF NOT FOUND THEN
        RETURN NULL; -- deleted since: its delete settles the key
    END IF;
    IF cur.state IN ('succeeded', 'cancelled') THEN
        PERFORM relay_jobs_key_settle(cur.queue, cur.ordering_key);
    ELSIF cur.state = 'queued' THEN
        IF TG_OP = 'UPDATE' AND OLD.state IN ('dead', 'cancelled') THEN
            -- Requeued: the later queued jobs of its key wait behind it.
            UPDATE relay_jobs SET key_waiting = true
            WHERE queue = cur.queue AND ordering_key = cur.ordering_key AND id > cur.id
              AND state = 'queued' AND NOT key_waiting;
        END IF;
        PERFORM relay_jobs_key_place(cur.id);
    END IF;
    RETURN NULL;
END;
$$;

CREATE CONSTRAINT TRIGGER relay_jobs_key_insert
    AFTER INSERT ON relay_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.key_waiting)
    EXECUTE FUNCTION relay_jobs_key_at_commit();

-- Fires for keyed rows that leave the unfinished set, come back to it
-- (requeue), or start waiting.
CREATE CONSTRAINT TRIGGER relay_jobs_key_update
    AFTER UPDATE OF state, key_waiting ON relay_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL AND (
        (NEW.state IN ('succeeded', 'cancelled') AND OLD.state IN ('queued', 'claimed', 'dead'))
        OR (NEW.state = 'queued' AND OLD.state IN ('dead', 'cancelled'))
        OR (NEW.key_waiting AND NOT OLD.key_waiting AND NEW.state = 'queued')))
    EXECUTE FUNCTION relay_jobs_key_at_commit();

CREATE CONSTRAINT TRIGGER relay_jobs_key_delete
    AFTER DELETE ON relay_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL AND OLD.state IN ('queued', 'claimed', 'dead'))
    EXECUTE FUNCTION relay_jobs_key_at_commit();
