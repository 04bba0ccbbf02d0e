-- The insert trigger's check reads one column per inserted row.
--
-- relay_jobs_after_insert runs once per insert statement: at a steady
-- 1,000 single enqueues a second, once per job. Its check selected, from
-- the transition table, each bad row's id, state and broken rule, so the
-- rules (relay_jobs_broken_rule, inlined: every rule's expression) were
-- built into the query's projection as well as its WHERE clause. PL/pgSQL
-- keeps the plan, but the executor builds a plan's expressions again at
-- every run, and that set-up was most of the trigger's cost (perf: the
-- trigger was 8.5% of PostgreSQL's CPU at 1,000 jobs/s, half of it in
-- ExecutorStart). Now the check returns only the first bad row's id; the
-- row's state and rule are read again, by id, only when there is one.
-- Same rules, same errors (RLY01 for a job not inserted queued, 23514
-- check_violation for a broken rule).

CREATE OR REPLACE FUNCTION relay_jobs_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    bad_id bigint;
    bad record;
BEGIN
    SELECT i.id INTO bad_id
    FROM inserted AS i
    WHERE i.state <> 'queued' OR relay_jobs_broken_rule(i) IS NOT NULL
    LIMIT 1;
    IF FOUND THEN
        SELECT i.id, i.state, relay_jobs_broken_rule(i) AS rule INTO bad
        FROM inserted AS i
        WHERE i.id IS NOT DISTINCT FROM bad_id
          AND (i.state <> 'queued' OR relay_jobs_broken_rule(i) IS NOT NULL)
        LIMIT 1;
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
