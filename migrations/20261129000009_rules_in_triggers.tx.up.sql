-- The rules of a job row move from CHECK constraints into the two triggers
-- that already run on every insert statement and every state change.
--
-- Why: at the start of every INSERT or UPDATE statement PostgreSQL rebuilds
-- each CHECK constraint of the table from its stored text and plans it
-- again. relay_jobs had ten (8 KB of node text), and under a steady 1,000
-- jobs/s — a single enqueue, a one-job claim, a small completion batch per
-- statement — that was 16% of PostgreSQL's CPU (perf, ExecConstraints).
-- PL/pgSQL plans are made once per connection, so the same rules cost a
-- per-row expression instead.
--
-- The rules are unchanged, and still hold for every writer, ours or not:
-- inserts are checked by the statement-level insert trigger, updates of any
-- column a rule reads by the row-level update trigger. A broken rule fails
-- the statement with SQLSTATE 23514 (check_violation), as the constraints
-- did; an illegal state change still fails with RLY01.

ALTER TABLE relay_jobs
    DROP CONSTRAINT relay_jobs_kind_check,
    DROP CONSTRAINT relay_jobs_queue_check,
    DROP CONSTRAINT relay_jobs_state_check,
    DROP CONSTRAINT relay_jobs_priority_check,
    DROP CONSTRAINT relay_jobs_attempt_check,
    DROP CONSTRAINT relay_jobs_max_attempts_check,
    DROP CONSTRAINT relay_jobs_lease_iff_claimed,
    DROP CONSTRAINT relay_jobs_finalized_iff_final,
    DROP CONSTRAINT relay_jobs_unique_key_has_states,
    DROP CONSTRAINT relay_jobs_ordering_key_check;

-- relay_jobs_broken_rule names the first rule job j breaks, or is NULL. A
-- plain SQL expression, so the planner inlines it into the triggers'
-- statements.
CREATE FUNCTION relay_jobs_broken_rule(j relay_jobs) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE
    WHEN j.kind = '' OR length(j.kind) > 255
        THEN 'kind must be 1 to 255 characters'
    WHEN j.queue = '' OR length(j.queue) > 128
        THEN 'queue must be 1 to 128 characters'
    WHEN j.state NOT IN ('queued', 'claimed', 'succeeded', 'dead', 'cancelled')
        THEN 'unknown state ' || j.state
    WHEN j.priority < 0
        THEN 'priority must be 0 or more'
    WHEN j.attempt < 0
        THEN 'attempt must be 0 or more'
    WHEN j.max_attempts < 1
        THEN 'max_attempts must be 1 or more'
    -- The lease exists exactly while the job is claimed: the fenced writes
    -- rely on it (a matching token means a claimed attempt).
    WHEN (j.state = 'claimed') <> (j.lease_token IS NOT NULL AND j.lease_expires_at IS NOT NULL)
        THEN 'a job holds a lease exactly while it is claimed'
    WHEN (j.state IN ('succeeded', 'dead', 'cancelled')) <> (j.finalized_at IS NOT NULL)
        THEN 'a job has finalized_at exactly while it is final'
    WHEN (j.unique_key IS NULL) <> (j.unique_states IS NULL)
        THEN 'unique_key and unique_states are set together'
    WHEN j.ordering_key = '' OR length(j.ordering_key) > 500
        THEN 'ordering_key must be 1 to 500 characters'
END
$$;

-- Inserts: queued only, every rule holds; then the wake-up, as before.
CREATE OR REPLACE FUNCTION relay_jobs_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    bad record;
BEGIN
    SELECT i.id, i.state, relay_jobs_broken_rule(i) AS rule INTO bad
    FROM inserted AS i
    WHERE i.state <> 'queued' OR relay_jobs_broken_rule(i) IS NOT NULL
    LIMIT 1;
    IF FOUND THEN
        IF bad.state <> 'queued' THEN
            RAISE EXCEPTION 'relay: jobs must be inserted queued'
                USING ERRCODE = 'RLY01';
        END IF;
        RAISE EXCEPTION 'relay: job %: %', bad.id, bad.rule
            USING ERRCODE = 'check_violation';
    END IF;
    IF current_setting('relay.notify', true) IS DISTINCT FROM 'after' THEN
        PERFORM pg_notify('relay_jobs', q.queue)
        FROM (SELECT DISTINCT queue FROM inserted WHERE run_at <= now()) AS q;
    END IF;
    RETURN NULL;
END;
$$;

-- Updates: the state machine (keep in step with docs/state-machine.md and
-- core/state.go), then every rule.
CREATE OR REPLACE FUNCTION relay_jobs_check_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    rule text;
BEGIN
    IF OLD.state IS DISTINCT FROM NEW.state AND (OLD.state, NEW.state) NOT IN (
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
    rule := relay_jobs_broken_rule(NEW);
    IF rule IS NOT NULL THEN
        RAISE EXCEPTION 'relay: job %: %', NEW.id, rule
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

-- No WHEN clause: a trigger's WHEN is rebuilt from text per statement too.
-- The column list is every column a rule reads; a heartbeat (which sets
-- lease_expires_at) fires it, an update of args alone does not.
DROP TRIGGER relay_jobs_state_machine ON relay_jobs;
CREATE TRIGGER relay_jobs_state_machine
    BEFORE UPDATE OF state, kind, queue, priority, attempt, max_attempts,
        lease_token, lease_expires_at, finalized_at, unique_key, unique_states, ordering_key
    ON relay_jobs
    FOR EACH ROW
    EXECUTE FUNCTION relay_jobs_check_transition();
