-- A job may be inserted claimed for its first attempt, as a claim would
-- leave it: attempt 1, attempted_at and a lease (token and expiry) set,
-- no ordering key (whose order only the queue's claims keep).
--
-- A child run whose parent waits for it at once is executed in the
-- parent's worker slot by the client executing the parent. Its job was
-- inserted queued and then claimed by that client (queued -> claimed):
-- two row versions, the claim's update with its lease index entry and the
-- state machine's trigger, 0.53 ms of a child run's 4.3 ms of statement
-- time (docs/benchmarks.md, "Child runs inserted claimed"). Inserted
-- claimed, it is written once.
--
-- relay_jobs_insert_check's clause is the old one with the first rule
-- widened (queued, or claimed for a first attempt) and the lease rule
-- written as the state machine's (a lease exactly while claimed); the
-- other rules are unchanged. relay_jobs_insert_refused raises RLY01 for
-- any other state, or a claimed row that is not a first attempt.

CREATE OR REPLACE FUNCTION relay_jobs_insert_refused() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    rule text := relay_jobs_broken_rule(NEW);
BEGIN
    IF NEW.state <> 'queued' AND NOT (NEW.state = 'claimed' AND NEW.attempt = 1
            AND NEW.attempted_at IS NOT NULL AND NEW.ordering_key IS NULL) THEN
        RAISE EXCEPTION 'relay: jobs must be inserted queued, or claimed for a first attempt (attempt 1, attempted_at set, no ordering key)'
            USING ERRCODE = 'RLY01';
    END IF;
    IF rule IS NOT NULL THEN
        RAISE EXCEPTION 'relay: job %: %', NEW.id, rule
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER relay_jobs_insert_check ON relay_jobs;
CREATE TRIGGER relay_jobs_insert_check
    AFTER INSERT ON relay_jobs
    FOR EACH ROW
    WHEN ((NEW.state <> 'queued' AND NOT (NEW.state = 'claimed' AND NEW.attempt = 1
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
          OR array_position(NEW.tags, '') IS NOT NULL)
    EXECUTE FUNCTION relay_jobs_insert_refused();
