-- The state machine and the row rules are tested in the trigger's WHEN
-- clause; the PL/pgSQL function runs only for a write it may refuse.
--
-- relay_jobs_state_machine called relay_jobs_check_transition for every
-- updated row: each claim and each success paid a PL/pgSQL call, which
-- builds NEW and OLD as records and reads each column a rule names from
-- them one field at a time. A WHEN clause is evaluated on the row being
-- written, as column reads, without a call. It does not call
-- relay_jobs_broken_rule: a trigger's WHEN is planned again by every
-- statement, and inlining that SQL function parses its body each time,
-- which cost a 100-row UPDATE more than the PL/pgSQL calls it saved.
--
-- The clause is true whenever the function would raise, so no write the
-- function refused gets through; the function is unchanged (same SQLSTATE
-- and message: RLY01 for an illegal transition, 23514 check_violation for
-- a broken rule). The function raises when the transition is illegal (the
-- clause's first test: the same eight transitions, grouped by the state
-- they leave, which reads back the same from schema.sql) or when NEW
-- breaks a rule and its first broken rule differs from OLD's. Split the rules of
-- relay_jobs_broken_rule by the columns they read:
--   - hot rules read what claims, outcomes, heartbeats and the rescuer
--     write (state, attempt, the lease, finalized_at, the timestamps);
--     the clause evaluates each on NEW and on OLD;
--   - cold rules read only kind, queue, priority, max_attempts,
--     unique_key, unique_states, ordering_key and tags; the clause tests
--     whether any of those changed.
-- When the clause is false, no hot rule is broken in NEW or OLD and every
-- cold rule reads the same values in both, so NEW's first broken rule (a
-- cold one, if any) is OLD's: the function would not raise. A rule added
-- to relay_jobs_broken_rule must be added here too (a hot rule to both
-- lists, a cold rule's columns to the changed ones):
-- TestStateMachineWhenNamesEveryRuleColumn fails on a column missing here.
DROP TRIGGER relay_jobs_state_machine ON relay_jobs;
CREATE TRIGGER relay_jobs_state_machine
    BEFORE UPDATE OF state, kind, queue, priority, attempt, max_attempts,
        lease_token, lease_expires_at, finalized_at, unique_key, unique_states, ordering_key,
        run_at, created_at, attempted_at, tags
    ON relay_jobs
    FOR EACH ROW
    WHEN ((OLD.state IS DISTINCT FROM NEW.state AND NOT (
                 (OLD.state = 'queued' AND NEW.state IN ('claimed', 'cancelled'))
              OR (OLD.state = 'claimed' AND NEW.state IN ('succeeded', 'queued', 'dead', 'cancelled'))
              OR (OLD.state IN ('dead', 'cancelled') AND NEW.state = 'queued')))
          -- The hot rules, on NEW.
          OR NEW.state NOT IN ('queued', 'claimed', 'succeeded', 'dead', 'cancelled')
          OR NEW.attempt < 0
          OR (NEW.state = 'claimed') <> (NEW.lease_token IS NOT NULL AND NEW.lease_expires_at IS NOT NULL)
          OR (NEW.state IN ('succeeded', 'dead', 'cancelled')) <> (NEW.finalized_at IS NOT NULL)
          OR isfinite(NEW.run_at) IS FALSE OR isfinite(NEW.created_at) IS FALSE
          OR isfinite(NEW.attempted_at) IS FALSE OR isfinite(NEW.finalized_at) IS FALSE
          OR isfinite(NEW.lease_expires_at) IS FALSE
          -- The hot rules, on OLD.
          OR OLD.state NOT IN ('queued', 'claimed', 'succeeded', 'dead', 'cancelled')
          OR OLD.attempt < 0
          OR (OLD.state = 'claimed') <> (OLD.lease_token IS NOT NULL AND OLD.lease_expires_at IS NOT NULL)
          OR (OLD.state IN ('succeeded', 'dead', 'cancelled')) <> (OLD.finalized_at IS NOT NULL)
          OR isfinite(OLD.run_at) IS FALSE OR isfinite(OLD.created_at) IS FALSE
          OR isfinite(OLD.attempted_at) IS FALSE OR isfinite(OLD.finalized_at) IS FALSE
          OR isfinite(OLD.lease_expires_at) IS FALSE
          -- The cold rules' columns.
          OR NEW.kind IS DISTINCT FROM OLD.kind
          OR NEW.queue IS DISTINCT FROM OLD.queue
          OR NEW.priority IS DISTINCT FROM OLD.priority
          OR NEW.max_attempts IS DISTINCT FROM OLD.max_attempts
          OR NEW.unique_key IS DISTINCT FROM OLD.unique_key
          OR NEW.unique_states IS DISTINCT FROM OLD.unique_states
          OR NEW.ordering_key IS DISTINCT FROM OLD.ordering_key
          OR NEW.tags IS DISTINCT FROM OLD.tags)
    EXECUTE FUNCTION relay_jobs_check_transition();
