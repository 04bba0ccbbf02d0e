-- One table of live processes, for every Relay process that runs
-- (internal/liveness): worker and producer clients, schedulers, outbox
-- dispatchers, relay serve. Each records itself at Start, heartbeats every
-- quarter of its own liveness timeout and deletes itself at Stop. An entry
-- is live while its last heartbeat is within its own timeout
-- (relay_process_live, the one rule every statement uses); an expired one is
-- deleted by whichever live process sweeps next.
--
-- The scheduler's and the outbox's declarations ("declared in code, owned
-- by a namespace, kept alive by live processes") stand on it: such a
-- process lists what it declares in declares, under role and namespace.
-- Their two tables of the same shape are moved here and dropped (no view
-- keeps their names: nothing reads them but the code this replaces).
CREATE TABLE relay_processes (
    id            text        PRIMARY KEY,
    -- worker (a client with queues), client (one without), scheduler,
    -- dispatcher, serve.
    role          text        NOT NULL,
    -- What the process calls itself: a client's Config.ID (the
    -- attempted_by of its jobs); empty for the others.
    name          text        NOT NULL DEFAULT '',
    namespace     text        NOT NULL DEFAULT '',
    declares      text[]      NOT NULL DEFAULT '{}',
    host          text        NOT NULL DEFAULT '',
    pid           integer     NOT NULL DEFAULT 0,
    version       text        NOT NULL DEFAULT '',
    -- The queues a worker serves: {"queue": slots, ...}.
    queues        jsonb       NOT NULL DEFAULT '{}',
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    liveness_secs float8      NOT NULL DEFAULT 60,
    CONSTRAINT relay_processes_role_check CHECK (role <> '' AND length(role) <= 64),
    CONSTRAINT relay_processes_liveness_check CHECK (liveness_secs > 0)
);
CREATE INDEX relay_processes_role_namespace_idx ON relay_processes (role, namespace);

-- relay_process_live is the liveness rule: a heartbeat within the entry's
-- own timeout (a sweeper's timeout says nothing of another's heartbeat
-- interval). Inlined by the planner.
CREATE FUNCTION relay_process_live(heartbeat_at timestamptz, liveness_secs float8) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT heartbeat_at > now() - make_interval(secs => liveness_secs) $$;

INSERT INTO relay_processes (id, role, namespace, declares, started_at, heartbeat_at, liveness_secs)
SELECT id, 'scheduler', namespace, schedules, started_at, heartbeat_at, liveness_secs
FROM relay_scheduler_processes;
INSERT INTO relay_processes (id, role, namespace, declares, started_at, heartbeat_at, liveness_secs)
SELECT id, 'dispatcher', namespace, subscriptions, started_at, heartbeat_at, liveness_secs
FROM relay_outbox_processes
ON CONFLICT (id) DO NOTHING;
DROP TABLE relay_scheduler_processes;
DROP TABLE relay_outbox_processes;
