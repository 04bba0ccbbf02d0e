-- The schema every migration in this directory builds, as PostgreSQL 15's
-- pg_dump --schema-only --no-owner --no-privileges prints it, without its
-- session settings. Generated: do not edit. Regenerate it with
--   go test ./migrations -run TestSchemaFile -update
-- A test fails when it is stale. Read it to see the live triggers,
-- functions and indexes; the numbered files remain what runs.

-- Name: relay_hold_lease(bigint, uuid); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_hold_lease(job_id bigint, token uuid) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM 1 FROM relay_jobs WHERE id = job_id AND lease_token = token FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'relay: job %: the attempt no longer holds the lease', job_id
            USING ERRCODE = 'RLY02';
    END IF;
END;
$$;

-- Name: relay_jobs_after_insert(); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_after_insert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('relay_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE run_at <= now()) AS q;
    RETURN NULL;
END;
$$;

-- Name: relay_jobs; Type: TABLE; Schema: public

CREATE TABLE public.relay_jobs (
    id bigint NOT NULL,
    kind text NOT NULL,
    queue text DEFAULT 'default'::text NOT NULL,
    args jsonb DEFAULT '{}'::jsonb NOT NULL,
    state text DEFAULT 'queued'::text NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 25 NOT NULL,
    run_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_token uuid,
    lease_expires_at timestamp with time zone,
    attempted_by text,
    attempted_at timestamp with time zone,
    last_error text,
    history jsonb DEFAULT '[]'::jsonb NOT NULL,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    finalized_at timestamp with time zone,
    unique_key text,
    unique_states text[],
    ordering_key text,
    tags text[] DEFAULT '{}'::text[] NOT NULL,
    key_waiting boolean DEFAULT false NOT NULL
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_insert_scale_factor='0.05', autovacuum_analyze_scale_factor='0.02', autovacuum_vacuum_cost_limit='2000', autovacuum_vacuum_cost_delay='1');

-- Name: relay_jobs_broken_rule(public.relay_jobs); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_broken_rule(j public.relay_jobs) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$
SELECT (relay_jobs_broken_rules(j))[1]
$$;

-- Name: relay_jobs_broken_rules(public.relay_jobs); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_broken_rules(j public.relay_jobs) RETURNS text[]
    LANGUAGE sql IMMUTABLE
    AS $$
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

-- Name: relay_jobs_check_transition(); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_check_transition() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

-- Name: relay_jobs_insert_check(); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_insert_check() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

-- Name: relay_jobs_key_at_commit(); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_key_at_commit() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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
        IF TG_OP <> 'INSERT' AND NOT relay_jobs_key_fix(OLD.queue, OLD.ordering_key) THEN
            PERFORM relay_jobs_key_hand_off(OLD.queue, OLD.ordering_key);
        END IF;
        IF TG_OP <> 'DELETE' AND NOT relay_jobs_key_fix(NEW.queue, NEW.ordering_key) THEN
            PERFORM relay_jobs_key_hand_off(NEW.queue, NEW.ordering_key);
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
        IF NOT relay_jobs_key_fix(e.q, e.k) THEN
            PERFORM relay_jobs_key_hand_off(e.q, e.k);
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

-- Name: relay_jobs_key_before_insert(); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_key_before_insert() RETURNS trigger
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
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

-- Name: relay_jobs_key_changed(); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_key_changed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM relay_jobs_key_note(OLD.queue, OLD.ordering_key);
    IF TG_OP = 'UPDATE' THEN
        PERFORM relay_jobs_key_note(NEW.queue, NEW.ordering_key);
        RETURN NEW;
    END IF;
    RETURN OLD;
END;
$$;

-- Name: relay_jobs_key_fix(text, text); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_key_fix(q text, k text) RETURNS boolean
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    f       record;
    settled boolean := current_setting('transaction_isolation') = 'read committed';
BEGIN
    IF q IS NULL OR k IS NULL THEN
        RETURN true;
    END IF;
    SELECT id, state, key_waiting INTO f
    FROM relay_jobs
    WHERE queue = q AND ordering_key = k AND state IN ('queued', 'claimed', 'dead')
    ORDER BY id
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN settled;
    END IF;
    IF NOT settled THEN
        -- The snapshot is the transaction's: a head finished by a commit
        -- it does not see would be taken for unfinished, and the jobs
        -- behind it would wait for ever. Locking the head fails with a
        -- serialization failure (to retry) when it changed since, and
        -- when another transaction is changing it now. (A job committed
        -- since is not seen at all: the hand-off covers that.)
        BEGIN
            PERFORM 1 FROM relay_jobs WHERE id = f.id FOR NO KEY UPDATE NOWAIT;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'relay: the head of ordering key % is changing; retry the transaction', k
                USING ERRCODE = 'serialization_failure';
        END;
    END IF;
    IF f.state = 'queued' AND f.key_waiting THEN
        -- Never wait on the row: a transaction holding it may stay open
        -- as long as its caller likes. Stepped over, the key is handed off.
        UPDATE relay_jobs SET key_waiting = false
        WHERE id IN (
            SELECT id FROM relay_jobs
            WHERE id = f.id AND state = 'queued' AND key_waiting
            FOR NO KEY UPDATE SKIP LOCKED)
          AND state = 'queued' AND key_waiting;
        IF NOT FOUND THEN
            settled := false;
        END IF;
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
    RETURN settled;
END;
$$;

-- Name: relay_jobs_key_hand_off(text, text); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_key_hand_off(q text, k text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    -- No unique key: ON CONFLICT under REPEATABLE READ fails on a row
    -- committed since the snapshot. The re-fix takes duplicates together.
    INSERT INTO relay_job_key_refix (queue, ordering_key) VALUES (q, k);
    PERFORM pg_notify('relay_control', 'keys');
END;
$$;

-- Name: relay_jobs_key_moved(text, text, text, text, text, text); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_key_moved(old_queue text, new_queue text, old_key text, new_key text, old_state text, new_state text) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    RETURN old_queue IS DISTINCT FROM new_queue
        OR old_key IS DISTINCT FROM new_key
        OR (old_state <> new_state
            AND old_state || '>' || new_state <> ALL ('{queued>claimed,claimed>dead}'::text[]));
END;
$$;

-- Name: relay_jobs_key_note(text, text); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_key_note(q text, k text) RETURNS void
    LANGUAGE plpgsql
    AS $$
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

-- Name: relay_jobs_key_refix(integer); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_key_refix(n integer, OUT taken integer, OUT "left" integer) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    e record;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'relay_jobs_key_refix runs in READ COMMITTED only (it reads what is committed)';
    END IF;
    taken := 0;
    "left" := 0;
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('relay_jobs|ordering keys', 0));
    FOR e IN
        WITH t AS (
            DELETE FROM relay_job_key_refix
            WHERE id IN (SELECT id FROM relay_job_key_refix ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED)
            RETURNING queue, ordering_key)
        SELECT queue AS q, ordering_key AS k, count(*) AS rows,
               hashtextextended('relay_jobs|' || queue || '|' || ordering_key, 0) AS lock
        FROM t
        GROUP BY queue, ordering_key
        ORDER BY 4
    LOOP
        taken := taken + e.rows;
        PERFORM pg_advisory_xact_lock(e.lock);
        IF NOT relay_jobs_key_fix(e.q, e.k) THEN
            INSERT INTO relay_job_key_refix (queue, ordering_key) VALUES (e.q, e.k);
            "left" := "left" + 1;
        END IF;
    END LOOP;
END;
$$;

-- Name: relay_jobs_rewake(integer); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_rewake(n integer, OUT taken integer, OUT "left" integer) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    ids bigint[];
BEGIN
    WITH t AS (
        DELETE FROM relay_job_rewake
        WHERE id IN (SELECT id FROM relay_job_rewake ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED)
        RETURNING job_id)
    SELECT array_agg(DISTINCT job_id), count(*) INTO ids, taken FROM t;
    "left" := 0;
    IF ids IS NOT NULL THEN
        "left" := relay_jobs_wake(ids, false);
    END IF;
END;
$$;

-- Name: relay_jobs_wake(bigint[], boolean); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_jobs_wake(ids bigint[], notify boolean) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    woken  bigint[] := '{}';
    job    bigint;
    q      text;
    handed integer;
BEGIN
    FOR job, q IN
        UPDATE relay_jobs AS j
        SET run_at = CASE WHEN j.state = 'claimed' OR j.run_at > clock_timestamp() THEN clock_timestamp() ELSE j.run_at END
        WHERE j.id IN (SELECT f.id FROM relay_jobs AS f WHERE f.id = ANY (ids) AND f.state IN ('claimed', 'queued')
                       FOR UPDATE SKIP LOCKED)
        RETURNING j.id, CASE WHEN j.state = 'queued' THEN j.queue END
    LOOP
        woken := woken || job;
        IF q IS NOT NULL THEN
            PERFORM pg_notify('relay_jobs', q);
        END IF;
    END LOOP;
    -- The rest, as this statement's snapshot last saw them: claimed or
    -- queued rows were held by another transaction (SKIP LOCKED stepped
    -- over them), and are handed off.
    INSERT INTO relay_job_rewake (job_id)
    SELECT f.id FROM relay_jobs AS f
    WHERE f.id = ANY (ids) AND NOT f.id = ANY (woken) AND f.state IN ('claimed', 'queued');
    GET DIAGNOSTICS handed = ROW_COUNT;
    IF handed > 0 AND notify THEN
        PERFORM pg_notify('relay_control', 'wakes');
    END IF;
    RETURN handed;
END;
$$;

-- Name: relay_outbox_after_insert(); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_outbox_after_insert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('relay_outbox', '');
    RETURN NULL;
END;
$$;

-- Name: relay_process_live(timestamp with time zone, double precision); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_process_live(heartbeat_at timestamp with time zone, liveness_secs double precision) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT heartbeat_at > now() - make_interval(secs => liveness_secs) $$;

-- Name: relay_workflow_cancel_tree(text, boolean); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_workflow_cancel_tree(text, boolean) RETURNS integer
    LANGUAGE plpgsql
    AS $_$
DECLARE
    jobs bigint[];
BEGIN
    SELECT array_agg(j) INTO jobs FROM relay_workflow_request_cancel($1, $2) AS j;
    PERFORM relay_workflow_wake(jobs);
    RETURN coalesce(cardinality(jobs), 0);
END;
$_$;

-- Name: relay_workflow_job_ended(); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_workflow_job_ended() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    run        text := NEW.args->>'run_id';
    parent_job bigint;
    msg        text;
BEGIN
    IF OLD.state = NEW.state OR run IS NULL THEN
        RETURN NULL;
    END IF;
    IF NEW.state = 'dead' THEN
        -- last_error is cut to 1,500 characters (6,000 bytes at most), so
        -- the message stays within workflow.MaxErrorBytes (8 KiB).
        msg := format('workflow: run %s: %s executions crashed or failed, and its job %s is dead (last: %s)',
            run, NEW.attempt, NEW.id, left(coalesce(NEW.last_error, 'unknown'), 1500));
    ELSE
        msg := format('workflow: run %s: its job %s was cancelled, so nothing executes the run (cancel a run with workflow.Cancel; workflow.Retry runs it again)',
            run, NEW.id);
    END IF;
    UPDATE relay_workflow_runs AS r
    SET state = 'failed', error = msg, finished_at = now()
    WHERE r.id = run AND r.job_id = NEW.id AND r.finished_at IS NULL
    RETURNING coalesce((SELECT p.job_id FROM relay_workflow_runs AS p
                        WHERE p.id = r.parent_id AND p.finished_at IS NULL), 0)
    INTO parent_job;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('relay_workflow', run);
    PERFORM relay_workflow_cancel_tree(run, false);
    PERFORM relay_workflow_terminate_children(run);
    PERFORM relay_workflow_wake(ARRAY[parent_job]);
    RETURN NULL;
END;
$$;

-- Name: relay_workflow_request_cancel(text, boolean); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_workflow_request_cancel(text, boolean) RETURNS SETOF bigint
    LANGUAGE sql
    AS $_$
WITH RECURSIVE tree AS (
    SELECT $1 AS id, 0 AS depth
    UNION
    SELECT c.id, tree.depth + 1 FROM relay_workflow_runs AS c JOIN tree ON c.parent_id = tree.id
    WHERE c.parent_close IS DISTINCT FROM 'abandon'
), locked AS (
    SELECT r.id FROM relay_workflow_runs AS r JOIN tree ON r.id = tree.id
    WHERE r.finished_at IS NULL AND (tree.depth > 0 OR $2)
    ORDER BY tree.depth, r.id
    FOR NO KEY UPDATE OF r
)
UPDATE relay_workflow_runs AS r
SET cancel_requested = true
FROM locked
WHERE r.id = locked.id
RETURNING coalesce(r.job_id, 0)
$_$;

-- Name: relay_workflow_runs_cancel_wins(); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_workflow_runs_cancel_wins() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'relay: workflow run %: cannot end % while a cancel is requested (it ends cancelled)', NEW.id, NEW.state
        USING ERRCODE = 'RLY01';
END;
$$;

-- Name: relay_workflow_runs_check(); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_workflow_runs_check() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.state NOT IN ('pending', 'running', 'compensating', 'completed', 'failed', 'compensated', 'cancelled', 'terminated') THEN
        RAISE EXCEPTION 'relay: workflow run %: unknown state %', NEW.id, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'pending' THEN
            RAISE EXCEPTION 'relay: workflow runs must be inserted pending'
                USING ERRCODE = 'RLY01';
        END IF;
    ELSIF OLD.state IS DISTINCT FROM NEW.state AND (OLD.state, NEW.state) NOT IN (
        ('pending',      'running'),      -- first execution
        ('pending',      'completed'),    -- completed in its first write
        ('pending',      'failed'),       -- could not start (executions crashed)
        ('pending',      'cancelled'),    -- cancelled before it ran
        ('pending',      'terminated'),   -- terminated before it ran
        ('running',      'completed'),    -- the function returned
        ('running',      'failed'),       -- failed, nothing to compensate
        ('running',      'compensating'), -- failed or cancelled, undoing
        ('running',      'cancelled'),    -- cancelled, nothing to compensate
        ('running',      'terminated'),   -- terminated: nothing undone
        ('compensating', 'compensated'),  -- failed and undone
        ('compensating', 'cancelled'),    -- cancelled and undone
        ('compensating', 'failed'),       -- a compensation failed
        ('compensating', 'terminated'),   -- terminated: the undoing stops
        ('failed',       'pending')       -- retry from the failed step
    ) THEN
        RAISE EXCEPTION 'relay: illegal workflow run state transition % -> % (run %)',
            OLD.state, NEW.state, OLD.id
            USING ERRCODE = 'RLY01';
    END IF;
    IF (NEW.state IN ('completed', 'failed', 'compensated', 'cancelled', 'terminated')) <> (NEW.finished_at IS NOT NULL) THEN
        RAISE EXCEPTION 'relay: workflow run %: finished_at is set exactly while the run is final', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

-- Name: relay_workflow_runs_deleted(); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_workflow_runs_deleted() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM relay_workflow_steps WHERE run_id = OLD.id;
    RETURN NULL;
END;
$$;

-- Name: relay_workflow_terminate_children(text); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_workflow_terminate_children(parent text) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    kid     text;
    kid_job bigint;
    token   text;
BEGIN
    FOR kid IN
        SELECT id FROM relay_workflow_runs
        WHERE parent_id = parent AND parent_close = 'terminate' AND finished_at IS NULL
        ORDER BY id
        FOR NO KEY UPDATE
    LOOP
        UPDATE relay_workflow_runs
        SET state = 'terminated', finished_at = now(),
            error = format('workflow: run %s terminated: its parent %s ended (ChildOpts.ParentClose is ParentCloseTerminate)', kid, parent)
        WHERE id = kid AND finished_at IS NULL
        RETURNING coalesce(job_id, 0) INTO kid_job;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;
        PERFORM pg_notify('relay_workflow', kid);
        PERFORM relay_workflow_cancel_tree(kid, false);
        PERFORM relay_workflow_terminate_children(kid);
        IF kid_job <> 0 THEN
            WITH old AS (SELECT id, lease_token FROM relay_jobs WHERE id = kid_job FOR UPDATE)
            UPDATE relay_jobs AS j
            SET state = 'cancelled', finalized_at = now(), lease_token = NULL, lease_expires_at = NULL
            FROM old
            WHERE j.id = old.id AND j.state IN ('queued', 'claimed')
            RETURNING coalesce(old.lease_token::text, '') INTO token;
            IF FOUND THEN
                PERFORM pg_notify('relay_control', 'cancel:' || kid_job || ':' || token);
            END IF;
        END IF;
    END LOOP;
END;
$$;

-- Name: relay_workflow_wake(bigint[]); Type: FUNCTION; Schema: public

CREATE FUNCTION public.relay_workflow_wake(bigint[]) RETURNS void
    LANGUAGE plpgsql
    AS $_$
BEGIN
    PERFORM relay_jobs_wake($1, true);
END;
$_$;

-- Name: relay_admin_audit; Type: TABLE; Schema: public

CREATE TABLE public.relay_admin_audit (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    subject text NOT NULL,
    action text NOT NULL,
    target jsonb DEFAULT '{}'::jsonb NOT NULL,
    rows_changed bigint DEFAULT 0 NOT NULL
);

-- Name: relay_admin_audit_id_seq; Type: SEQUENCE; Schema: public

ALTER TABLE public.relay_admin_audit ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.relay_admin_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: relay_idempotency_keys; Type: TABLE; Schema: public

CREATE TABLE public.relay_idempotency_keys (
    scope text NOT NULL,
    key text NOT NULL,
    status text NOT NULL,
    result jsonb,
    token uuid DEFAULT gen_random_uuid() NOT NULL,
    owner uuid,
    lease_expires_at timestamp with time zone,
    request_hash text,
    expires_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT relay_idempotency_keys_key_check CHECK (((key <> ''::text) AND (length(key) <= 500))),
    CONSTRAINT relay_idempotency_keys_scope_check CHECK (((scope <> ''::text) AND (length(scope) <= 200))),
    CONSTRAINT relay_idempotency_keys_status_check CHECK ((status = ANY (ARRAY['running'::text, 'succeeded'::text]))),
    CONSTRAINT relay_idempotency_running_has_lease CHECK (((status = 'running'::text) = (owner IS NOT NULL))),
    CONSTRAINT relay_idempotency_succeeded_has_result CHECK (((status <> 'succeeded'::text) OR (result IS NOT NULL)))
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_vacuum_threshold='1000', autovacuum_analyze_scale_factor='0.05');

-- Name: relay_job_key_refix; Type: TABLE; Schema: public

CREATE TABLE public.relay_job_key_refix (
    id bigint NOT NULL,
    queue text NOT NULL,
    ordering_key text NOT NULL,
    noted_at timestamp with time zone DEFAULT now() NOT NULL
);

-- Name: relay_job_key_refix_id_seq; Type: SEQUENCE; Schema: public

ALTER TABLE public.relay_job_key_refix ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.relay_job_key_refix_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: relay_job_rewake; Type: TABLE; Schema: public

CREATE TABLE public.relay_job_rewake (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    noted_at timestamp with time zone DEFAULT now() NOT NULL
);

-- Name: relay_job_rewake_id_seq; Type: SEQUENCE; Schema: public

ALTER TABLE public.relay_job_rewake ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.relay_job_rewake_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: relay_jobs_id_seq; Type: SEQUENCE; Schema: public

ALTER TABLE public.relay_jobs ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.relay_jobs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: relay_limits; Type: TABLE; Schema: public

CREATE TABLE public.relay_limits (
    scope text NOT NULL,
    name text NOT NULL,
    max_running integer DEFAULT 0 NOT NULL,
    rate integer DEFAULT 0 NOT NULL,
    per_us bigint DEFAULT 1000000 NOT NULL,
    window_start timestamp with time zone DEFAULT now() NOT NULL,
    window_count integer DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT relay_limits_max_running_check CHECK ((max_running >= 0)),
    CONSTRAINT relay_limits_name_check CHECK ((name <> ''::text)),
    CONSTRAINT relay_limits_per_us_check CHECK ((per_us > 0)),
    CONSTRAINT relay_limits_rate_check CHECK ((rate >= 0)),
    CONSTRAINT relay_limits_scope_check CHECK ((scope = ANY (ARRAY['queue'::text, 'kind'::text, 'tag'::text])))
);

-- Name: relay_migration_locks; Type: TABLE; Schema: public

CREATE TABLE public.relay_migration_locks (
    id bigint NOT NULL,
    table_name character varying
);

-- Name: relay_migration_locks_id_seq; Type: SEQUENCE; Schema: public

CREATE SEQUENCE public.relay_migration_locks_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

-- Name: relay_migration_locks_id_seq; Type: SEQUENCE OWNED BY; Schema: public

ALTER SEQUENCE public.relay_migration_locks_id_seq OWNED BY public.relay_migration_locks.id;

-- Name: relay_migrations; Type: TABLE; Schema: public

CREATE TABLE public.relay_migrations (
    id bigint NOT NULL,
    name character varying,
    group_id bigint,
    migrated_at timestamp with time zone DEFAULT CURRENT_TIMESTAMP NOT NULL
);

-- Name: relay_migrations_id_seq; Type: SEQUENCE; Schema: public

CREATE SEQUENCE public.relay_migrations_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

-- Name: relay_migrations_id_seq; Type: SEQUENCE OWNED BY; Schema: public

ALTER SEQUENCE public.relay_migrations_id_seq OWNED BY public.relay_migrations.id;

-- Name: relay_outbox; Type: TABLE; Schema: public

CREATE TABLE public.relay_outbox (
    id bigint NOT NULL,
    topic text NOT NULL,
    key text,
    payload jsonb NOT NULL,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    published_at timestamp with time zone DEFAULT now() NOT NULL,
    dispatched_at timestamp with time zone,
    jobs integer,
    trace_context jsonb,
    failed_at timestamp with time zone,
    dispatch_error text,
    CONSTRAINT relay_outbox_check CHECK (((dispatched_at IS NULL) = (jobs IS NULL))),
    CONSTRAINT relay_outbox_key_check CHECK (((key IS NULL) OR ((key <> ''::text) AND (length(key) <= 500)))),
    CONSTRAINT relay_outbox_topic_check CHECK (((topic <> ''::text) AND (length(topic) <= 200)))
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_vacuum_threshold='1000', autovacuum_analyze_scale_factor='0.05');

-- Name: relay_outbox_id_seq; Type: SEQUENCE; Schema: public

ALTER TABLE public.relay_outbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.relay_outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: relay_outbox_subscriptions; Type: TABLE; Schema: public

CREATE TABLE public.relay_outbox_subscriptions (
    id text NOT NULL,
    namespace text NOT NULL,
    topic text NOT NULL,
    kind text NOT NULL,
    endpoint text NOT NULL,
    queue text NOT NULL,
    priority integer,
    max_attempts integer NOT NULL,
    metadata jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    retired_at timestamp with time zone
);

-- Name: relay_processes; Type: TABLE; Schema: public

CREATE TABLE public.relay_processes (
    id text NOT NULL,
    role text NOT NULL,
    name text DEFAULT ''::text NOT NULL,
    namespace text DEFAULT ''::text NOT NULL,
    declares text[] DEFAULT '{}'::text[] NOT NULL,
    host text DEFAULT ''::text NOT NULL,
    pid integer DEFAULT 0 NOT NULL,
    version text DEFAULT ''::text NOT NULL,
    queues jsonb DEFAULT '{}'::jsonb NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    liveness_secs double precision DEFAULT 60 NOT NULL,
    CONSTRAINT relay_processes_liveness_check CHECK ((liveness_secs > (0)::double precision)),
    CONSTRAINT relay_processes_role_check CHECK (((role <> ''::text) AND (length(role) <= 64)))
);

-- Name: relay_queue_pauses; Type: TABLE; Schema: public

CREATE TABLE public.relay_queue_pauses (
    queue text NOT NULL,
    paused_at timestamp with time zone DEFAULT now() NOT NULL,
    paused_by text DEFAULT ''::text NOT NULL,
    CONSTRAINT relay_queue_pauses_queue_check CHECK (((queue <> ''::text) AND (length(queue) <= 128)))
);

-- Name: relay_schedule_fires; Type: TABLE; Schema: public

CREATE TABLE public.relay_schedule_fires (
    schedule text NOT NULL,
    fire_time timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    job_id bigint,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT relay_schedule_fires_outcome_check CHECK ((outcome = ANY (ARRAY['enqueued'::text, 'skipped_overlap'::text, 'triggered'::text, 'backfilled'::text])))
)
WITH (autovacuum_vacuum_scale_factor='0.05', autovacuum_analyze_scale_factor='0.05');

-- Name: relay_schedules; Type: TABLE; Schema: public

CREATE TABLE public.relay_schedules (
    name text NOT NULL,
    spec text NOT NULL,
    timezone text NOT NULL,
    kind text NOT NULL,
    args jsonb NOT NULL,
    queue text NOT NULL,
    priority integer NOT NULL,
    max_attempts integer NOT NULL,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    catch_up text NOT NULL,
    catch_up_limit integer NOT NULL,
    overlap text NOT NULL,
    next_fire_at timestamp with time zone NOT NULL,
    last_fire_at timestamp with time zone,
    last_job_id bigint,
    paused boolean DEFAULT false NOT NULL,
    disabled_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    namespace text DEFAULT 'default'::text NOT NULL,
    broken_error text,
    broken_at timestamp with time zone,
    CONSTRAINT relay_schedules_catch_up_check CHECK ((catch_up = ANY (ARRAY['latest'::text, 'skip'::text, 'all'::text]))),
    CONSTRAINT relay_schedules_catch_up_limit_check CHECK ((catch_up_limit >= 0)),
    CONSTRAINT relay_schedules_name_check CHECK (((name <> ''::text) AND (length(name) <= 200))),
    CONSTRAINT relay_schedules_overlap_check CHECK ((overlap = ANY (ARRAY['allow'::text, 'skip'::text])))
);

-- Name: relay_workflow_events; Type: TABLE; Schema: public

CREATE TABLE public.relay_workflow_events (
    run_id text NOT NULL,
    key text NOT NULL,
    value jsonb NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

-- Name: relay_workflow_heartbeats; Type: TABLE; Schema: public

CREATE TABLE public.relay_workflow_heartbeats (
    run_id text NOT NULL,
    "position" integer NOT NULL,
    key text NOT NULL,
    attempt integer NOT NULL,
    details jsonb NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL
);

-- Name: relay_workflow_runs; Type: TABLE; Schema: public

CREATE TABLE public.relay_workflow_runs (
    id text NOT NULL,
    workflow text NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    input jsonb NOT NULL,
    output jsonb,
    error text,
    queue text NOT NULL,
    job_id bigint,
    parent_id text,
    parent_position integer,
    trace jsonb DEFAULT '{}'::jsonb NOT NULL,
    cancel_requested boolean DEFAULT false NOT NULL,
    generation integer DEFAULT 0 NOT NULL,
    executions integer DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    retry_from integer,
    deadline_at timestamp with time zone,
    parent_close text,
    tags text[] DEFAULT '{}'::text[] NOT NULL
)
WITH (fillfactor='70');

-- Name: relay_workflow_signals; Type: TABLE; Schema: public

CREATE TABLE public.relay_workflow_signals (
    id bigint NOT NULL,
    run_id text NOT NULL,
    name text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    consumed_at timestamp with time zone,
    consumed_by integer,
    decode_error text
);

-- Name: relay_workflow_signals_id_seq; Type: SEQUENCE; Schema: public

ALTER TABLE public.relay_workflow_signals ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.relay_workflow_signals_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: relay_workflow_steps; Type: TABLE; Schema: public

CREATE TABLE public.relay_workflow_steps (
    run_id text NOT NULL,
    "position" integer NOT NULL,
    key text NOT NULL,
    kind text NOT NULL,
    state text NOT NULL,
    output jsonb,
    error text,
    attempts integer DEFAULT 0 NOT NULL,
    wake_at timestamp with time zone,
    child_id text,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    attempt_log jsonb DEFAULT '[]'::jsonb NOT NULL,
    error_info jsonb
);

-- Name: relay_workflow_updates; Type: TABLE; Schema: public

CREATE TABLE public.relay_workflow_updates (
    id bigint NOT NULL,
    run_id text NOT NULL,
    name text NOT NULL,
    request jsonb NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    response jsonb,
    error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    handled_at timestamp with time zone,
    CONSTRAINT relay_workflow_updates_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'completed'::text, 'rejected'::text])))
);

-- Name: relay_workflow_updates_id_seq; Type: SEQUENCE; Schema: public

ALTER TABLE public.relay_workflow_updates ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.relay_workflow_updates_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: relay_migration_locks id; Type: DEFAULT; Schema: public

ALTER TABLE ONLY public.relay_migration_locks ALTER COLUMN id SET DEFAULT nextval('public.relay_migration_locks_id_seq'::regclass);

-- Name: relay_migrations id; Type: DEFAULT; Schema: public

ALTER TABLE ONLY public.relay_migrations ALTER COLUMN id SET DEFAULT nextval('public.relay_migrations_id_seq'::regclass);

-- Name: relay_admin_audit relay_admin_audit_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_admin_audit
    ADD CONSTRAINT relay_admin_audit_pkey PRIMARY KEY (id);

-- Name: relay_idempotency_keys relay_idempotency_keys_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_idempotency_keys
    ADD CONSTRAINT relay_idempotency_keys_pkey PRIMARY KEY (scope, key);

-- Name: relay_job_key_refix relay_job_key_refix_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_job_key_refix
    ADD CONSTRAINT relay_job_key_refix_pkey PRIMARY KEY (id);

-- Name: relay_job_rewake relay_job_rewake_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_job_rewake
    ADD CONSTRAINT relay_job_rewake_pkey PRIMARY KEY (id);

-- Name: relay_jobs relay_jobs_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_jobs
    ADD CONSTRAINT relay_jobs_pkey PRIMARY KEY (id);

-- Name: relay_limits relay_limits_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_limits
    ADD CONSTRAINT relay_limits_pkey PRIMARY KEY (scope, name);

-- Name: relay_migration_locks relay_migration_locks_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_migration_locks
    ADD CONSTRAINT relay_migration_locks_pkey PRIMARY KEY (id);

-- Name: relay_migration_locks relay_migration_locks_table_name_key; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_migration_locks
    ADD CONSTRAINT relay_migration_locks_table_name_key UNIQUE (table_name);

-- Name: relay_migrations relay_migrations_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_migrations
    ADD CONSTRAINT relay_migrations_pkey PRIMARY KEY (id);

-- Name: relay_outbox relay_outbox_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_outbox
    ADD CONSTRAINT relay_outbox_pkey PRIMARY KEY (id);

-- Name: relay_outbox_subscriptions relay_outbox_subscriptions_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_outbox_subscriptions
    ADD CONSTRAINT relay_outbox_subscriptions_pkey PRIMARY KEY (id);

-- Name: relay_processes relay_processes_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_processes
    ADD CONSTRAINT relay_processes_pkey PRIMARY KEY (id);

-- Name: relay_queue_pauses relay_queue_pauses_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_queue_pauses
    ADD CONSTRAINT relay_queue_pauses_pkey PRIMARY KEY (queue);

-- Name: relay_schedule_fires relay_schedule_fires_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_schedule_fires
    ADD CONSTRAINT relay_schedule_fires_pkey PRIMARY KEY (schedule, fire_time);

-- Name: relay_schedules relay_schedules_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_schedules
    ADD CONSTRAINT relay_schedules_pkey PRIMARY KEY (name);

-- Name: relay_workflow_events relay_workflow_events_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_workflow_events
    ADD CONSTRAINT relay_workflow_events_pkey PRIMARY KEY (run_id, key);

-- Name: relay_workflow_heartbeats relay_workflow_heartbeats_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_workflow_heartbeats
    ADD CONSTRAINT relay_workflow_heartbeats_pkey PRIMARY KEY (run_id, "position");

-- Name: relay_workflow_runs relay_workflow_runs_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_workflow_runs
    ADD CONSTRAINT relay_workflow_runs_pkey PRIMARY KEY (id);

-- Name: relay_workflow_signals relay_workflow_signals_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_workflow_signals
    ADD CONSTRAINT relay_workflow_signals_pkey PRIMARY KEY (id);

-- Name: relay_workflow_steps relay_workflow_steps_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_workflow_steps
    ADD CONSTRAINT relay_workflow_steps_pkey PRIMARY KEY (run_id, "position");

-- Name: relay_workflow_updates relay_workflow_updates_pkey; Type: CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_workflow_updates
    ADD CONSTRAINT relay_workflow_updates_pkey PRIMARY KEY (id);

-- Name: relay_idempotency_keys_expires_idx; Type: INDEX; Schema: public

CREATE INDEX relay_idempotency_keys_expires_idx ON public.relay_idempotency_keys USING btree (expires_at);

-- Name: relay_jobs_claim_idx; Type: INDEX; Schema: public

CREATE INDEX relay_jobs_claim_idx ON public.relay_jobs USING btree (queue, key_waiting, priority, run_at, id) WHERE (state = 'queued'::text);

-- Name: relay_jobs_dead_idx; Type: INDEX; Schema: public

CREATE INDEX relay_jobs_dead_idx ON public.relay_jobs USING btree (queue) WHERE (state = 'dead'::text);

-- Name: relay_jobs_finalized_idx; Type: INDEX; Schema: public

CREATE INDEX relay_jobs_finalized_idx ON public.relay_jobs USING btree (state, finalized_at) WHERE (state = ANY (ARRAY['succeeded'::text, 'dead'::text, 'cancelled'::text]));

-- Name: relay_jobs_key_heads_idx; Type: INDEX; Schema: public

CREATE INDEX relay_jobs_key_heads_idx ON public.relay_jobs USING btree (queue, ordering_key, id) WHERE ((ordering_key IS NOT NULL) AND (state = 'queued'::text) AND (NOT key_waiting));

-- Name: relay_jobs_lease_idx; Type: INDEX; Schema: public

CREATE INDEX relay_jobs_lease_idx ON public.relay_jobs USING btree (lease_expires_at) WHERE (state = 'claimed'::text);

-- Name: relay_jobs_ordering_idx; Type: INDEX; Schema: public

CREATE INDEX relay_jobs_ordering_idx ON public.relay_jobs USING btree (queue, ordering_key, id) WHERE ((ordering_key IS NOT NULL) AND (state = ANY (ARRAY['queued'::text, 'claimed'::text, 'dead'::text])));

-- Name: relay_jobs_tags_idx; Type: INDEX; Schema: public

CREATE INDEX relay_jobs_tags_idx ON public.relay_jobs USING gin (tags) WHERE (tags <> '{}'::text[]);

-- Name: relay_jobs_unique_idx; Type: INDEX; Schema: public

CREATE UNIQUE INDEX relay_jobs_unique_idx ON public.relay_jobs USING btree (unique_key) WHERE ((unique_key IS NOT NULL) AND (state = ANY (unique_states)));

-- Name: relay_outbox_pending_idx; Type: INDEX; Schema: public

CREATE INDEX relay_outbox_pending_idx ON public.relay_outbox USING btree (id) WHERE (dispatched_at IS NULL);

-- Name: relay_outbox_subscriptions_active_idx; Type: INDEX; Schema: public

CREATE INDEX relay_outbox_subscriptions_active_idx ON public.relay_outbox_subscriptions USING btree (topic) WHERE (retired_at IS NULL);

-- Name: relay_processes_role_namespace_idx; Type: INDEX; Schema: public

CREATE INDEX relay_processes_role_namespace_idx ON public.relay_processes USING btree (role, namespace);

-- Name: relay_schedule_fires_recorded_idx; Type: INDEX; Schema: public

CREATE INDEX relay_schedule_fires_recorded_idx ON public.relay_schedule_fires USING btree (recorded_at);

-- Name: relay_schedules_due_idx; Type: INDEX; Schema: public

CREATE INDEX relay_schedules_due_idx ON public.relay_schedules USING btree (next_fire_at) WHERE ((NOT paused) AND (disabled_at IS NULL));

-- Name: relay_workflow_runs_error_idx; Type: INDEX; Schema: public

CREATE INDEX relay_workflow_runs_error_idx ON public.relay_workflow_runs USING btree (created_at, id) WHERE (error IS NOT NULL);

-- Name: relay_workflow_runs_list_idx; Type: INDEX; Schema: public

CREATE INDEX relay_workflow_runs_list_idx ON public.relay_workflow_runs USING btree (created_at, id);

-- Name: relay_workflow_runs_parent_idx; Type: INDEX; Schema: public

CREATE INDEX relay_workflow_runs_parent_idx ON public.relay_workflow_runs USING btree (parent_id) WHERE (parent_id IS NOT NULL);

-- Name: relay_workflow_runs_tags_idx; Type: INDEX; Schema: public

CREATE INDEX relay_workflow_runs_tags_idx ON public.relay_workflow_runs USING gin (tags) WHERE (tags <> '{}'::text[]);

-- Name: relay_workflow_runs_unfinished_idx; Type: INDEX; Schema: public

CREATE INDEX relay_workflow_runs_unfinished_idx ON public.relay_workflow_runs USING btree (created_at, id) WHERE (finished_at IS NULL);

-- Name: relay_workflow_signals_pending_idx; Type: INDEX; Schema: public

CREATE INDEX relay_workflow_signals_pending_idx ON public.relay_workflow_signals USING btree (run_id, name, id) WHERE (consumed_at IS NULL);

-- Name: relay_workflow_signals_set_aside_idx; Type: INDEX; Schema: public

CREATE INDEX relay_workflow_signals_set_aside_idx ON public.relay_workflow_signals USING btree (run_id, id) WHERE (decode_error IS NOT NULL);

-- Name: relay_workflow_updates_pending_idx; Type: INDEX; Schema: public

CREATE INDEX relay_workflow_updates_pending_idx ON public.relay_workflow_updates USING btree (run_id, name, id) WHERE (state = 'pending'::text);

-- Name: relay_workflow_updates_run_idx; Type: INDEX; Schema: public

CREATE INDEX relay_workflow_updates_run_idx ON public.relay_workflow_updates USING btree (run_id);

-- Name: relay_jobs relay_jobs_after_insert; Type: TRIGGER; Schema: public

CREATE TRIGGER relay_jobs_after_insert AFTER INSERT ON public.relay_jobs REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT WHEN ((current_setting('relay.notify'::text, true) IS DISTINCT FROM 'after'::text)) EXECUTE FUNCTION public.relay_jobs_after_insert();

-- Name: relay_jobs relay_jobs_cold_rules; Type: TRIGGER; Schema: public

CREATE TRIGGER relay_jobs_cold_rules BEFORE UPDATE OF kind, queue, priority, max_attempts, unique_key, unique_states, ordering_key, tags, created_at ON public.relay_jobs FOR EACH ROW WHEN (((new.kind IS DISTINCT FROM old.kind) OR (new.queue IS DISTINCT FROM old.queue) OR (new.priority IS DISTINCT FROM old.priority) OR (new.max_attempts IS DISTINCT FROM old.max_attempts) OR (new.unique_key IS DISTINCT FROM old.unique_key) OR (new.unique_states IS DISTINCT FROM old.unique_states) OR (new.ordering_key IS DISTINCT FROM old.ordering_key) OR (new.tags IS DISTINCT FROM old.tags) OR (new.created_at IS DISTINCT FROM old.created_at))) EXECUTE FUNCTION public.relay_jobs_check_transition();

-- Name: relay_jobs relay_jobs_insert_check; Type: TRIGGER; Schema: public

CREATE TRIGGER relay_jobs_insert_check BEFORE INSERT ON public.relay_jobs FOR EACH ROW EXECUTE FUNCTION public.relay_jobs_insert_check();

-- Name: relay_jobs relay_jobs_key_before_insert; Type: TRIGGER; Schema: public

CREATE TRIGGER relay_jobs_key_before_insert BEFORE INSERT ON public.relay_jobs FOR EACH ROW WHEN ((new.ordering_key IS NOT NULL)) EXECUTE FUNCTION public.relay_jobs_key_before_insert();

-- Name: relay_jobs relay_jobs_key_delete; Type: TRIGGER; Schema: public

CREATE CONSTRAINT TRIGGER relay_jobs_key_delete AFTER DELETE ON public.relay_jobs DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (((old.ordering_key IS NOT NULL) AND (old.state = ANY (ARRAY['queued'::text, 'claimed'::text, 'dead'::text])))) EXECUTE FUNCTION public.relay_jobs_key_at_commit();

-- Name: relay_jobs relay_jobs_key_delete_note; Type: TRIGGER; Schema: public

CREATE TRIGGER relay_jobs_key_delete_note AFTER DELETE ON public.relay_jobs FOR EACH ROW WHEN (((old.ordering_key IS NOT NULL) AND (old.state = ANY (ARRAY['queued'::text, 'claimed'::text, 'dead'::text])))) EXECUTE FUNCTION public.relay_jobs_key_changed();

-- Name: relay_jobs relay_jobs_key_insert; Type: TRIGGER; Schema: public

CREATE CONSTRAINT TRIGGER relay_jobs_key_insert AFTER INSERT ON public.relay_jobs DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ((new.ordering_key IS NOT NULL)) EXECUTE FUNCTION public.relay_jobs_key_at_commit();

-- Name: relay_jobs relay_jobs_key_update; Type: TRIGGER; Schema: public

CREATE CONSTRAINT TRIGGER relay_jobs_key_update AFTER UPDATE OF state, queue, ordering_key ON public.relay_jobs DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ((((old.ordering_key IS NOT NULL) OR (new.ordering_key IS NOT NULL)) AND public.relay_jobs_key_moved(old.queue, new.queue, old.ordering_key, new.ordering_key, old.state, new.state))) EXECUTE FUNCTION public.relay_jobs_key_at_commit();

-- Name: relay_jobs relay_jobs_key_update_note; Type: TRIGGER; Schema: public

CREATE TRIGGER relay_jobs_key_update_note AFTER UPDATE OF state, queue, ordering_key ON public.relay_jobs FOR EACH ROW WHEN ((((old.ordering_key IS NOT NULL) OR (new.ordering_key IS NOT NULL)) AND public.relay_jobs_key_moved(old.queue, new.queue, old.ordering_key, new.ordering_key, old.state, new.state))) EXECUTE FUNCTION public.relay_jobs_key_changed();

-- Name: relay_jobs relay_jobs_state_machine; Type: TRIGGER; Schema: public

CREATE TRIGGER relay_jobs_state_machine BEFORE UPDATE OF state, attempt, lease_token, lease_expires_at, finalized_at, attempted_at, run_at ON public.relay_jobs FOR EACH ROW WHEN (((new.state IS NULL) OR ((old.state <> new.state) AND (((old.state || '>'::text) || new.state) <> ALL ('{queued>claimed,queued>cancelled,claimed>succeeded,claimed>queued,claimed>dead,claimed>cancelled,dead>queued,cancelled>queued}'::text[]))) OR (new.state <> ALL ('{queued,claimed,succeeded,dead,cancelled}'::text[])) OR (new.attempt < 0) OR ((new.state = 'claimed'::text) <> ((new.lease_token IS NOT NULL) AND (new.lease_expires_at IS NOT NULL))) OR ((new.state = ANY ('{succeeded,dead,cancelled}'::text[])) <> (new.finalized_at IS NOT NULL)) OR (isfinite(new.run_at) IS FALSE) OR (isfinite(new.attempted_at) IS FALSE) OR (isfinite(new.finalized_at) IS FALSE) OR (isfinite(new.lease_expires_at) IS FALSE))) EXECUTE FUNCTION public.relay_jobs_check_transition();

-- Name: relay_outbox relay_outbox_after_insert; Type: TRIGGER; Schema: public

CREATE TRIGGER relay_outbox_after_insert AFTER INSERT ON public.relay_outbox FOR EACH STATEMENT EXECUTE FUNCTION public.relay_outbox_after_insert();

-- Name: relay_jobs relay_workflow_job_ended; Type: TRIGGER; Schema: public

CREATE TRIGGER relay_workflow_job_ended AFTER UPDATE OF state ON public.relay_jobs FOR EACH ROW WHEN (((new.kind = 'relay.workflow'::text) AND (new.state = ANY ('{dead,cancelled}'::text[])))) EXECUTE FUNCTION public.relay_workflow_job_ended();

-- Name: relay_workflow_runs relay_workflow_runs_cancel_wins; Type: TRIGGER; Schema: public

CREATE TRIGGER relay_workflow_runs_cancel_wins BEFORE UPDATE OF state ON public.relay_workflow_runs FOR EACH ROW WHEN (((new.state = ANY (ARRAY['completed'::text, 'compensated'::text])) AND new.cancel_requested)) EXECUTE FUNCTION public.relay_workflow_runs_cancel_wins();

-- Name: relay_workflow_runs relay_workflow_runs_check; Type: TRIGGER; Schema: public

CREATE TRIGGER relay_workflow_runs_check BEFORE INSERT OR UPDATE OF state, finished_at ON public.relay_workflow_runs FOR EACH ROW EXECUTE FUNCTION public.relay_workflow_runs_check();

-- Name: relay_workflow_runs relay_workflow_runs_deleted; Type: TRIGGER; Schema: public

CREATE TRIGGER relay_workflow_runs_deleted AFTER DELETE ON public.relay_workflow_runs FOR EACH ROW EXECUTE FUNCTION public.relay_workflow_runs_deleted();

-- Name: relay_schedule_fires relay_schedule_fires_schedule_fkey; Type: FK CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_schedule_fires
    ADD CONSTRAINT relay_schedule_fires_schedule_fkey FOREIGN KEY (schedule) REFERENCES public.relay_schedules(name) ON DELETE CASCADE;

-- Name: relay_workflow_events relay_workflow_events_run_id_fkey; Type: FK CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_workflow_events
    ADD CONSTRAINT relay_workflow_events_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.relay_workflow_runs(id) ON DELETE CASCADE;

-- Name: relay_workflow_heartbeats relay_workflow_heartbeats_run_id_fkey; Type: FK CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_workflow_heartbeats
    ADD CONSTRAINT relay_workflow_heartbeats_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.relay_workflow_runs(id) ON DELETE CASCADE;

-- Name: relay_workflow_runs relay_workflow_runs_parent_id_fkey; Type: FK CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_workflow_runs
    ADD CONSTRAINT relay_workflow_runs_parent_id_fkey FOREIGN KEY (parent_id) REFERENCES public.relay_workflow_runs(id) ON DELETE SET NULL;

-- Name: relay_workflow_signals relay_workflow_signals_run_id_fkey; Type: FK CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_workflow_signals
    ADD CONSTRAINT relay_workflow_signals_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.relay_workflow_runs(id) ON DELETE CASCADE;

-- Name: relay_workflow_updates relay_workflow_updates_run_id_fkey; Type: FK CONSTRAINT; Schema: public

ALTER TABLE ONLY public.relay_workflow_updates
    ADD CONSTRAINT relay_workflow_updates_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.relay_workflow_runs(id) ON DELETE CASCADE;
