-- Relay core: the leased job table.
--
-- One row per job. A job moves through the states of docs/state-machine.md;
-- the trigger relay_jobs_state_machine refuses every other transition, so no
-- SQL, ours or anyone's, can write a state change outside the diagram.

CREATE TABLE relay_jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind             text        NOT NULL CHECK (kind <> '' AND length(kind) <= 255),
    queue            text        NOT NULL DEFAULT 'default' CHECK (queue <> '' AND length(queue) <= 128),
    args             jsonb       NOT NULL DEFAULT '{}',
    state            text        NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'claimed', 'succeeded', 'dead', 'cancelled')),
    -- 0 is the most urgent; larger numbers run later.
    priority         smallint    NOT NULL DEFAULT 0 CHECK (priority >= 0),
    -- attempt counts executions started; it is incremented by the claim.
    attempt          integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     integer     NOT NULL DEFAULT 25 CHECK (max_attempts > 0),
    run_at           timestamptz NOT NULL DEFAULT now(),
    -- The lease: present exactly while the job is claimed. The token fences
    -- every write about the attempt; the expiry is renewed by heartbeats.
    lease_token      uuid,
    lease_expires_at timestamptz,
    -- Who ran the latest attempt (kept after the lease ends).
    attempted_by     text,
    attempted_at     timestamptz,
    last_error       text,
    -- One entry per attempt that did not succeed: attempt, started_at,
    -- finished_at, error, worker. The successful attempt is attempted_at ..
    -- finalized_at by attempted_by, so success writes nothing here.
    history          jsonb       NOT NULL DEFAULT '[]',
    -- Free-form metadata (trace context, schedule name, ...).
    metadata         jsonb       NOT NULL DEFAULT '{}',
    created_at       timestamptz NOT NULL DEFAULT now(),
    finalized_at     timestamptz,

    CONSTRAINT relay_jobs_lease_iff_claimed
        CHECK ((state = 'claimed') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT relay_jobs_finalized_iff_final
        CHECK ((state IN ('succeeded', 'dead', 'cancelled')) = (finalized_at IS NOT NULL))
);

-- Claim: the runnable jobs of a queue in claim order. Partial, so finished
-- rows never enter it and the claim stays one index probe away however many
-- finished rows the table holds.
CREATE INDEX relay_jobs_claim_idx ON relay_jobs (queue, priority, run_at, id)
    WHERE state = 'queued';

-- Rescue: leases in force, by expiry.
CREATE INDEX relay_jobs_lease_idx ON relay_jobs (lease_expires_at)
    WHERE state = 'claimed';

-- Retention: finished jobs, by age.
CREATE INDEX relay_jobs_finalized_idx ON relay_jobs (state, finalized_at)
    WHERE state IN ('succeeded', 'dead', 'cancelled');

-- The state machine. Keep in step with docs/state-machine.md and
-- core/state.go.
CREATE FUNCTION relay_jobs_check_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (OLD.state, NEW.state) NOT IN (
        ('queued',    'claimed'),    -- claim
        ('queued',    'cancelled'),  -- cancel
        ('claimed',   'succeeded'),  -- complete
        ('claimed',   'queued'),     -- retry, lease expired, released on shutdown
        ('claimed',   'dead'),       -- attempts exhausted or permanent failure
        ('claimed',   'cancelled'),  -- cancel a running job
        ('dead',      'queued'),     -- requeue
        ('cancelled', 'queued')      -- requeue
    ) THEN
        RAISE EXCEPTION 'relay: illegal job state transition % -> % (job %)',
            OLD.state, NEW.state, OLD.id
            USING ERRCODE = 'RLY01';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER relay_jobs_state_machine
    BEFORE UPDATE OF state ON relay_jobs
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION relay_jobs_check_transition();

-- Inserted jobs start queued, and wake the workers of their queue. One
-- notification per queue per statement; PostgreSQL folds duplicates within a
-- transaction and delivers them at commit, so a rollback wakes nobody.
CREATE FUNCTION relay_jobs_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted WHERE state <> 'queued') THEN
        RAISE EXCEPTION 'relay: jobs must be inserted queued'
            USING ERRCODE = 'RLY01';
    END IF;
    PERFORM pg_notify('relay_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE run_at <= now()) AS q;
    RETURN NULL;
END;
$$;

CREATE TRIGGER relay_jobs_after_insert
    AFTER INSERT ON relay_jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT
    EXECUTE FUNCTION relay_jobs_after_insert();
