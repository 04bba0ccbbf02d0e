-- Tags on jobs; the row rules refuse infinite timestamps; global limits.
--
-- Tags: a text array, empty by default (adding a column with a constant
-- default rewrites nothing). The GIN index covers tagged rows only, so
-- jobs without tags cost an insert nothing more; JobList's tag filter
-- says tags <> '{}' to use it.
ALTER TABLE relay_jobs ADD COLUMN tags text[] NOT NULL DEFAULT '{}';
CREATE INDEX relay_jobs_tags_idx ON relay_jobs USING gin (tags) WHERE tags <> '{}';

-- relay_jobs_broken_rule gains two rules, checked last:
--   - every timestamp is finite: 'infinity' and '-infinity' are valid
--     timestamptz values that no client can decode (a claim of such a row
--     used to fail to scan and take its whole batch with it);
--   - tags are at most 32 non-empty strings.
-- Earlier rules are unchanged.
CREATE OR REPLACE FUNCTION relay_jobs_broken_rule(j relay_jobs) RETURNS text
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
    -- No subquery (it would stop the planner inlining this function into
    -- the triggers), so a tag's length is checked by the client only.
    WHEN cardinality(j.tags) > 32 OR array_position(j.tags, NULL) IS NOT NULL
            OR array_position(j.tags, '') IS NOT NULL
        THEN 'tags must be at most 32 non-empty strings'
    WHEN isfinite(j.run_at) IS FALSE OR isfinite(j.created_at) IS FALSE
            OR isfinite(j.attempted_at) IS FALSE OR isfinite(j.finalized_at) IS FALSE
            OR isfinite(j.lease_expires_at) IS FALSE
        THEN 'timestamps must be finite (not infinity or -infinity)'
END
$$;

-- Updates: the state machine, then every rule — except that a row which
-- already broke a rule (written while the triggers were disabled, say)
-- may still be updated as long as the update breaks nothing new: the
-- client must be able to record such a job's failure and finish it.
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
    IF rule IS NOT NULL AND rule IS DISTINCT FROM relay_jobs_broken_rule(OLD) THEN
        RAISE EXCEPTION 'relay: job %: %', NEW.id, rule
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

-- The trigger now also watches the timestamps and tags the rules read.
DROP TRIGGER relay_jobs_state_machine ON relay_jobs;
CREATE TRIGGER relay_jobs_state_machine
    BEFORE UPDATE OF state, kind, queue, priority, attempt, max_attempts,
        lease_token, lease_expires_at, finalized_at, unique_key, unique_states, ordering_key,
        run_at, created_at, attempted_at, tags
    ON relay_jobs
    FOR EACH ROW
    EXECUTE FUNCTION relay_jobs_check_transition();

-- Global limits, enforced at claim time across every process: at most
-- max_running jobs of a queue, a kind or a tag claimed at once, and at most rate
-- claims per window of per_us microseconds. A claim of a limited queue
-- locks the limit rows that apply (so claims of limited work serialise),
-- counts the claimed jobs, claims no more than the limits allow and
-- advances the rate window, in one transaction. See core/limits.go.
CREATE TABLE relay_limits (
    -- A queue, a kind, or a tag (the jobs carrying it: a key such as
    -- tenant:acme or api:stripe).
    scope        text        NOT NULL CHECK (scope IN ('queue', 'kind', 'tag')),
    name         text        NOT NULL CHECK (name <> ''),
    -- 0: no concurrency limit.
    max_running  integer     NOT NULL DEFAULT 0 CHECK (max_running >= 0),
    -- 0: no rate limit.
    rate         integer     NOT NULL DEFAULT 0 CHECK (rate >= 0),
    per_us       bigint      NOT NULL DEFAULT 1000000 CHECK (per_us > 0),
    -- The current rate window and the claims made in it.
    window_start timestamptz NOT NULL DEFAULT now(),
    window_count integer     NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, name)
);
