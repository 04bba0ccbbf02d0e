-- The insert check is a row trigger's WHEN clause; the PL/pgSQL function
-- runs only for a row it refuses.
--
-- relay_jobs_after_insert ran once per insert statement, and its check
-- was a query over the statement's transition table: at a steady 1,000
-- single enqueues a second, a PL/pgSQL call and a query's executor
-- start-up per job. pgbench of one-row inserts (synchronous_commit off,
-- one client, 5,000 each): 0.55-0.59 ms a statement with it, 0.24-0.35 ms
-- with the trigger disabled, 0.32-0.35 ms with the check in a WHEN clause
-- (docs/benchmarks.md, "The insert check in a WHEN clause"). Like the
-- state machine's (migration *_state_machine_when), the clause spells the
-- rules out rather than calling relay_jobs_broken_rule: a WHEN that calls
-- that SQL function is planned again by every statement and parses its
-- body each time (0.82-1.0 ms a statement).
--
-- relay_jobs_insert_check's clause is true whenever a row is not queued
-- or breaks a rule of relay_jobs_broken_rule (for a queued row: the hot
-- rules on a queued row, and every cold rule), so no row the old check
-- refused gets through; relay_jobs_insert_refused raises as the old check
-- did (RLY01 for a job not inserted queued, 23514 check_violation naming
-- the broken rule). A rule added to relay_jobs_broken_rule must be added
-- here too: TestInsertCheckWhenNamesEveryRuleColumn fails on a column
-- missing here.
--
-- The wake-up of an insert made behind the API (relay.notify not 'after')
-- stays a statement trigger over the transition table, now with its own
-- WHEN: the library's inserts, which wake their queues after the commit,
-- no longer call it at all.

CREATE FUNCTION relay_jobs_insert_refused() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    rule text := relay_jobs_broken_rule(NEW);
BEGIN
    IF NEW.state <> 'queued' THEN
        RAISE EXCEPTION 'relay: jobs must be inserted queued'
            USING ERRCODE = 'RLY01';
    END IF;
    IF rule IS NOT NULL THEN
        RAISE EXCEPTION 'relay: job %: %', NEW.id, rule
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION relay_jobs_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('relay_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE run_at <= now()) AS q;
    RETURN NULL;
END;
$$;

CREATE TRIGGER relay_jobs_insert_check
    AFTER INSERT ON relay_jobs
    FOR EACH ROW
    WHEN (NEW.state <> 'queued'
          -- The hot rules, on a queued row.
          OR NEW.attempt < 0
          OR (NEW.lease_token IS NOT NULL AND NEW.lease_expires_at IS NOT NULL)
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

DROP TRIGGER relay_jobs_after_insert ON relay_jobs;
CREATE TRIGGER relay_jobs_after_insert
    AFTER INSERT ON relay_jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT
    WHEN (current_setting('relay.notify', true) IS DISTINCT FROM 'after')
    EXECUTE FUNCTION relay_jobs_after_insert();
