-- The job rules cost a small statement less: the insert check is a
-- PL/pgSQL row trigger, and the state machine's WHEN clause is split in
-- two by the columns an update sets, each half written small.
--
-- A trigger's WHEN clause is read back from pg_trigger's text and planned
-- again by every statement that may fire it (stringToNode, then
-- expression planning), at about 5 µs per kB of that text. The state
-- machine's clause was 18 kB and the insert check's 10.5 kB, so a one-job
-- claim paid ~85 µs for the first and a one-job enqueue ~53 µs for the
-- second, most of each statement's server time (pgbench, prepared, one
-- client, synchronous_commit off; docs/benchmarks.md, "What a trigger's
-- WHEN costs a small statement"). A PL/pgSQL function plans its
-- expressions once per connection.
--
-- The insert check: relay_jobs_insert_check is a BEFORE INSERT row trigger
-- with no WHEN; its function tests the same condition the clause tested
-- and raises as relay_jobs_insert_refused did (RLY01 for a job not
-- inserted queued or claimed for a first attempt, 23514 check_violation
-- naming the broken rule). Being a BEFORE trigger, it now also checks the
-- proposed row of an INSERT ... ON CONFLICT that conflicts (the library's
-- unique insert sends only rows the client validated), and a row that
-- both breaks a rule and has NULL in a NOT NULL column fails with the
-- rule's error rather than 23502. A one-job enqueue: 91 -> 53 µs. The PL/pgSQL
-- call costs ~1.3 µs more per row than the clause did, so a 1,000-job
-- batch pays ~1.3 ms more (6.7 -> 8.0 ms): single enqueues are the common
-- case (one job in the caller's transaction, a workflow's start).
--
-- The state machine: a write may now break no rule the row did not
-- already break (relay_jobs_broken_rules: every rule a row breaks). The
-- old check compared first broken rules, so fixing one rule of a row that
-- broke two was refused; a row breaks a rule only when it was written with
-- the triggers disabled. With that, the clause need not test OLD's rules,
-- and it is split by the columns an update sets (a trigger whose UPDATE OF
-- columns the statement does not set is not planned at all):
--   - relay_jobs_state_machine, on the columns claims, outcomes, retries,
--     heartbeats and the rescuer write: the transition, and the rules
--     over those columns, on NEW;
--   - relay_jobs_cold_rules, on every other column a rule reads: whether
--     any of them changed (none of the library's hot statements sets
--     them).
-- When both clauses are false (or their triggers do not fire), the
-- transition is legal, NEW breaks none of the hot rules, and every other
-- rule reads the same values in NEW as in OLD: no rule is newly broken,
-- and relay_jobs_check_transition would not raise. (A BEFORE trigger of
-- the user's that changes a rule column is not seen by a trigger that
-- fired before it, nor by one whose UPDATE OF columns the statement does
-- not set: such triggers on relay_jobs are not supported,
-- docs/state-machine.md.) The set comparison also refuses what the
-- first-rule comparison let through: a rule newly broken by a row that
-- already broke an earlier one. A one-job claim: 185 ->
-- 138 µs; a 100-job claim 1.53 -> 1.43 ms. A rule added to
-- relay_jobs_broken_rules must be added to one of the two clauses, its
-- columns to that trigger's UPDATE OF list:
-- TestStateMachineNamesEveryRuleColumn fails otherwise.

CREATE FUNCTION relay_jobs_broken_rules(j relay_jobs) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
SELECT array_remove(ARRAY[
    CASE WHEN j.kind = '' OR length(j.kind) > 255
        THEN 'kind must be 1 to 255 characters' END,
    CASE WHEN j.queue = '' OR length(j.queue) > 128
        THEN 'queue must be 1 to 128 characters' END,
    CASE WHEN j.state NOT IN ('queued', 'claimed', 'succeeded', 'dead', 'cancelled')
        THEN 'unknown state ' || j.state END,
    CASE WHEN j.priority < 0
        THEN 'priority must be 0 or more' END,
    CASE WHEN j.attempt < 0
        THEN 'attempt must be 0 or more' END,
    CASE WHEN j.max_attempts < 1
        THEN 'max_attempts must be 1 or more' END,
    -- The lease exists exactly while the job is claimed: the fenced writes
    -- rely on it (a matching token means a claimed attempt).
    CASE WHEN (j.state = 'claimed') <> (j.lease_token IS NOT NULL AND j.lease_expires_at IS NOT NULL)
        THEN 'a job holds a lease exactly while it is claimed' END,
    CASE WHEN (j.state IN ('succeeded', 'dead', 'cancelled')) <> (j.finalized_at IS NOT NULL)
        THEN 'a job has finalized_at exactly while it is final' END,
    CASE WHEN (j.unique_key IS NULL) <> (j.unique_states IS NULL)
        THEN 'unique_key and unique_states are set together' END,
    CASE WHEN j.ordering_key = '' OR length(j.ordering_key) > 500
        THEN 'ordering_key must be 1 to 500 characters' END,
    -- A tag's length is checked by the client only.
    CASE WHEN cardinality(j.tags) > 32 OR array_position(j.tags, NULL) IS NOT NULL
            OR array_position(j.tags, '') IS NOT NULL
        THEN 'tags must be at most 32 non-empty strings' END,
    CASE WHEN isfinite(j.run_at) IS FALSE OR isfinite(j.created_at) IS FALSE
            OR isfinite(j.attempted_at) IS FALSE OR isfinite(j.finalized_at) IS FALSE
            OR isfinite(j.lease_expires_at) IS FALSE
        THEN 'timestamps must be finite (not infinity or -infinity)' END
], NULL)
$$;

-- The first rule job j breaks, or NULL: as before, now read from the one
-- list of rules.
CREATE OR REPLACE FUNCTION relay_jobs_broken_rule(j relay_jobs) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT (relay_jobs_broken_rules(j))[1]
$$;

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
    -- The first rule NEW breaks that OLD did not: a row that already broke
    -- a rule (written while the triggers were disabled, say) may still be
    -- updated, so the client can record its failure and finish it.
    SELECT b.r INTO rule
    FROM unnest(relay_jobs_broken_rules(NEW)) WITH ORDINALITY AS b(r, i)
    WHERE b.r <> ALL (relay_jobs_broken_rules(OLD))
    ORDER BY b.i LIMIT 1;
    IF rule IS NOT NULL THEN
        RAISE EXCEPTION 'relay: job %: %', NEW.id, rule
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

DROP TRIGGER relay_jobs_state_machine ON relay_jobs;
CREATE TRIGGER relay_jobs_state_machine
    BEFORE UPDATE OF state, attempt, lease_token, lease_expires_at, finalized_at, attempted_at, run_at
    ON relay_jobs
    FOR EACH ROW
    -- The eight legal transitions as 'from>to' strings, and the lists as
    -- array literals: one constant each, where a list (IN, NOT IN) is a
    -- node per element in the stored clause, and eight comparisons of
    -- OLD.state and NEW.state were four times this text.
    WHEN (NEW.state IS NULL  -- RLY01, as before, rather than NOT NULL's 23502
          OR (OLD.state <> NEW.state
           AND OLD.state || '>' || NEW.state <> ALL ('{queued>claimed,queued>cancelled,claimed>succeeded,claimed>queued,claimed>dead,claimed>cancelled,dead>queued,cancelled>queued}'::text[]))
          -- The rules over this trigger's columns, on NEW.
          OR NEW.state <> ALL ('{queued,claimed,succeeded,dead,cancelled}'::text[])
          OR NEW.attempt < 0
          OR (NEW.state = 'claimed') <> (NEW.lease_token IS NOT NULL AND NEW.lease_expires_at IS NOT NULL)
          OR (NEW.state = ANY ('{succeeded,dead,cancelled}'::text[])) <> (NEW.finalized_at IS NOT NULL)
          OR isfinite(NEW.run_at) IS FALSE OR isfinite(NEW.attempted_at) IS FALSE
          OR isfinite(NEW.finalized_at) IS FALSE OR isfinite(NEW.lease_expires_at) IS FALSE)
    EXECUTE FUNCTION relay_jobs_check_transition();

CREATE TRIGGER relay_jobs_cold_rules
    BEFORE UPDATE OF kind, queue, priority, max_attempts, unique_key, unique_states, ordering_key, tags, created_at
    ON relay_jobs
    FOR EACH ROW
    WHEN (NEW.kind IS DISTINCT FROM OLD.kind
          OR NEW.queue IS DISTINCT FROM OLD.queue
          OR NEW.priority IS DISTINCT FROM OLD.priority
          OR NEW.max_attempts IS DISTINCT FROM OLD.max_attempts
          OR NEW.unique_key IS DISTINCT FROM OLD.unique_key
          OR NEW.unique_states IS DISTINCT FROM OLD.unique_states
          OR NEW.ordering_key IS DISTINCT FROM OLD.ordering_key
          OR NEW.tags IS DISTINCT FROM OLD.tags
          OR NEW.created_at IS DISTINCT FROM OLD.created_at)
    EXECUTE FUNCTION relay_jobs_check_transition();

-- The insert check, as relay_jobs_insert_refused and the clause of
-- migration *_insert_claimed: the condition is that clause's, true
-- whenever a row is neither queued nor claimed for a first attempt, or
-- breaks a rule (TestInsertCheckNamesEveryRuleColumn).
CREATE FUNCTION relay_jobs_insert_check() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    rule text;
BEGIN
    IF (NEW.state <> 'queued' AND NOT (NEW.state = 'claimed' AND NEW.attempt = 1
                                       AND NEW.attempted_at IS NOT NULL AND NEW.ordering_key IS NULL))
       -- The hot rules.
       OR NEW.attempt < 0
       OR (NEW.state = 'claimed') <> (NEW.lease_token IS NOT NULL AND NEW.lease_expires_at IS NOT NULL)
       OR NEW.finalized_at IS NOT NULL
       OR isfinite(NEW.run_at) IS FALSE OR isfinite(NEW.created_at) IS FALSE
       OR isfinite(NEW.attempted_at) IS FALSE OR isfinite(NEW.finalized_at) IS FALSE
       OR isfinite(NEW.lease_expires_at) IS FALSE
       -- The cold rules.
       OR NEW.kind = '' OR length(NEW.kind) > 255
       OR NEW.queue = '' OR length(NEW.queue) > 128
       OR NEW.priority < 0
       OR NEW.max_attempts < 1
       OR (NEW.unique_key IS NULL) <> (NEW.unique_states IS NULL)
       OR NEW.ordering_key = '' OR length(NEW.ordering_key) > 500
       OR cardinality(NEW.tags) > 32 OR array_position(NEW.tags, NULL) IS NOT NULL
       OR array_position(NEW.tags, '') IS NOT NULL
    THEN
        IF NEW.state <> 'queued' AND NOT (NEW.state = 'claimed' AND NEW.attempt = 1
                AND NEW.attempted_at IS NOT NULL AND NEW.ordering_key IS NULL) THEN
            RAISE EXCEPTION 'relay: jobs must be inserted queued, or claimed for a first attempt (attempt 1, attempted_at set, no ordering key)'
                USING ERRCODE = 'RLY01';
        END IF;
        rule := relay_jobs_broken_rule(NEW);
        IF rule IS NOT NULL THEN
            RAISE EXCEPTION 'relay: job %: %', NEW.id, rule
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END;
$$;

DROP TRIGGER relay_jobs_insert_check ON relay_jobs;
DROP FUNCTION relay_jobs_insert_refused();
CREATE TRIGGER relay_jobs_insert_check
    BEFORE INSERT ON relay_jobs
    FOR EACH ROW
    EXECUTE FUNCTION relay_jobs_insert_check();

-- The ordering keys' update triggers (migration *_ordering_heads), which
-- every claim and outcome also plans: the same clause, its state test as
-- the state machine's ('from>to' in an array literal), 3.5 -> 2.6 kB each.
-- The two clauses stay the same, so every deferred event finds its key
-- noted.
DROP TRIGGER relay_jobs_key_update_note ON relay_jobs;
CREATE TRIGGER relay_jobs_key_update_note
    AFTER UPDATE OF state, queue, ordering_key ON relay_jobs
    FOR EACH ROW
    WHEN ((OLD.ordering_key IS NOT NULL OR NEW.ordering_key IS NOT NULL)
          AND (OLD.queue IS DISTINCT FROM NEW.queue
               OR OLD.ordering_key IS DISTINCT FROM NEW.ordering_key
               OR (OLD.state <> NEW.state
                   AND OLD.state || '>' || NEW.state <> ALL ('{queued>claimed,claimed>dead}'::text[]))))
    EXECUTE FUNCTION relay_jobs_key_changed();

DROP TRIGGER relay_jobs_key_update ON relay_jobs;
CREATE CONSTRAINT TRIGGER relay_jobs_key_update
    AFTER UPDATE OF state, queue, ordering_key ON relay_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN ((OLD.ordering_key IS NOT NULL OR NEW.ordering_key IS NOT NULL)
          AND (OLD.queue IS DISTINCT FROM NEW.queue
               OR OLD.ordering_key IS DISTINCT FROM NEW.ordering_key
               OR (OLD.state <> NEW.state
                   AND OLD.state || '>' || NEW.state <> ALL ('{queued>claimed,claimed>dead}'::text[]))))
    EXECUTE FUNCTION relay_jobs_key_at_commit();
