-- Relay workflows: runs, their step checkpoints, a signal mailbox per run
-- and the events a run publishes. See docs/workflow.md.
--
-- A run is executed by a core job of kind relay.workflow (job_id); the run's
-- state machine is held by the trigger relay_workflow_runs_check, as the
-- job's is by relay_jobs_state_machine. Deleting a run deletes its steps,
-- signals and events in the same statement (ON DELETE CASCADE), so a run id
-- used again never meets an older run's checkpoints.

CREATE TABLE relay_workflow_runs (
    id               text        PRIMARY KEY,
    workflow         text        NOT NULL,
    state            text        NOT NULL DEFAULT 'pending',
    input            jsonb       NOT NULL,
    output           jsonb,
    error            text,
    queue            text        NOT NULL,
    job_id           bigint,
    parent_id        text        REFERENCES relay_workflow_runs (id) ON DELETE SET NULL,
    parent_position  integer,
    -- The root trace context (W3C traceparent/tracestate) every execution
    -- and child run is parented under.
    trace            jsonb       NOT NULL DEFAULT '{}',
    cancel_requested boolean     NOT NULL DEFAULT false,
    -- ContinueAsNew count: each generation starts with an empty history.
    generation       integer     NOT NULL DEFAULT 0,
    executions       integer     NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz
);

CREATE INDEX relay_workflow_runs_parent_idx ON relay_workflow_runs (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX relay_workflow_runs_list_idx ON relay_workflow_runs (created_at, id);

-- One row per step of a run, by position in the run's code path. Written
-- only by the attempt holding the run job's lease (core.HoldLease).
CREATE TABLE relay_workflow_steps (
    run_id      text        NOT NULL REFERENCES relay_workflow_runs (id) ON DELETE CASCADE,
    position    integer     NOT NULL,
    key         text        NOT NULL,
    kind        text        NOT NULL,
    -- completed, failed (for good), retrying (waits wake_at), waiting (a
    -- sleep, a signal or a child, until wake_at or a wake-up).
    state       text        NOT NULL,
    output      jsonb,
    error       text,
    attempts    integer     NOT NULL DEFAULT 0,
    wake_at     timestamptz,
    child_id    text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (run_id, position)
);

-- The mailbox: a signal waits here until one WaitSignal consumes it, in the
-- transaction that checkpoints the wait.
CREATE TABLE relay_workflow_signals (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      text        NOT NULL REFERENCES relay_workflow_runs (id) ON DELETE CASCADE,
    name        text        NOT NULL,
    payload     jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    consumed_at timestamptz,
    consumed_by integer
);

CREATE INDEX relay_workflow_signals_pending_idx ON relay_workflow_signals (run_id, name, id)
    WHERE consumed_at IS NULL;

-- Named values a run publishes while it runs (SetEvent / GetEvent).
CREATE TABLE relay_workflow_events (
    run_id     text        NOT NULL REFERENCES relay_workflow_runs (id) ON DELETE CASCADE,
    key        text        NOT NULL,
    value      jsonb       NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, key)
);

-- The run state machine (keep in step with docs/workflow.md and
-- workflow/state.go), and the rules of a run row.
CREATE FUNCTION relay_workflow_runs_check() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state NOT IN ('pending', 'running', 'compensating', 'completed', 'failed', 'compensated', 'cancelled') THEN
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
        ('pending',      'failed'),       -- could not start (executions crashed)
        ('pending',      'cancelled'),    -- cancelled before it ran
        ('running',      'completed'),    -- the function returned
        ('running',      'failed'),       -- failed, nothing to compensate
        ('running',      'compensating'), -- failed or cancelled, undoing
        ('running',      'cancelled'),    -- cancelled, nothing to compensate
        ('compensating', 'compensated'),  -- failed and undone
        ('compensating', 'cancelled'),    -- cancelled and undone
        ('compensating', 'failed'),       -- a compensation failed
        ('failed',       'pending')       -- retry from the failed step
    ) THEN
        RAISE EXCEPTION 'relay: illegal workflow run state transition % -> % (run %)',
            OLD.state, NEW.state, OLD.id
            USING ERRCODE = 'RLY01';
    END IF;
    IF (NEW.state IN ('completed', 'failed', 'compensated', 'cancelled')) <> (NEW.finished_at IS NOT NULL) THEN
        RAISE EXCEPTION 'relay: workflow run %: finished_at is set exactly while the run is final', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER relay_workflow_runs_check
    BEFORE INSERT OR UPDATE OF state, finished_at ON relay_workflow_runs
    FOR EACH ROW
    EXECUTE FUNCTION relay_workflow_runs_check();

-- relay_hold_lease is core.HoldLease as one statement that fails: it locks
-- job job_id's row FOR SHARE while the attempt holding token still holds
-- its lease, and raises RLY02 otherwise, aborting the transaction it runs
-- in. A pipelined batch (one round trip, one implicit transaction) can end
-- with it: every write of the batch commits only under the lease
-- (core.LeaseCheck).
CREATE FUNCTION relay_hold_lease(job_id bigint, token uuid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM relay_jobs WHERE id = job_id AND lease_token = token FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'relay: job %: the attempt no longer holds the lease', job_id
            USING ERRCODE = 'RLY02';
    END IF;
END;
$$;
