-- Layers hardening (issue 16): schedule owners and process liveness,
-- schedules a process cannot evaluate, idempotency-key cleanup, the
-- publisher's trace context on outbox events, and stored subscriptions.

-- Scheduler ------------------------------------------------------------------

-- A schedule belongs to a namespace (one per service): only the processes of
-- its namespace retire it, and only when none of them that is alive still
-- declares it.
ALTER TABLE relay_schedules ADD COLUMN namespace text NOT NULL DEFAULT 'default';
-- Set by a process that cannot evaluate the stored spec or time zone (a
-- newer version's declaration, a zone missing from its tzdata); cleared by
-- the next fire of a process that can. Such a process leaves the schedule to
-- the others instead of retrying it.
ALTER TABLE relay_schedules ADD COLUMN broken_error text;
ALTER TABLE relay_schedules ADD COLUMN broken_at timestamptz;

-- One row per running Scheduler: what it declares and when it was last seen
-- alive (database time). A schedule is retired only when no live process of
-- its namespace declares it; a row whose heartbeat is older than the
-- liveness timeout is dead and deleted by the next sweep.
CREATE TABLE relay_scheduler_processes (
    id           text        PRIMARY KEY,
    namespace    text        NOT NULL,
    schedules    text[]      NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX relay_scheduler_processes_namespace_idx ON relay_scheduler_processes (namespace);

-- Outbox ---------------------------------------------------------------------

-- The publisher's W3C trace context ({"traceparent": ..., "tracestate": ...}),
-- when Publish ran under a span: each job made from the event is parented
-- under it (or linked to it), so a request's trace reaches its subscribers.
ALTER TABLE relay_outbox ADD COLUMN trace_context jsonb;

-- Subscriptions, declared in code by dispatcher processes and stored here so
-- that every dispatcher fans out to the same set, whichever version declared
-- them. id is the JSON array [topic, kind, endpoint].
CREATE TABLE relay_outbox_subscriptions (
    id           text        PRIMARY KEY,
    namespace    text        NOT NULL,
    topic        text        NOT NULL,
    kind         text        NOT NULL,
    endpoint     text        NOT NULL,
    -- The jobs' enqueue options (zero: core's defaults).
    queue        text        NOT NULL,
    priority     integer,     -- NULL: the kind's default
    max_attempts integer     NOT NULL,
    metadata     jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    -- Set when no live dispatcher process of the namespace declares it: a
    -- retired subscription gets no more jobs.
    retired_at   timestamptz
);
CREATE INDEX relay_outbox_subscriptions_active_idx ON relay_outbox_subscriptions (topic) WHERE retired_at IS NULL;

-- One row per dispatcher process: what it declares, when last seen alive.
CREATE TABLE relay_outbox_processes (
    id            text        PRIMARY KEY,
    namespace     text        NOT NULL,
    subscriptions text[]      NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX relay_outbox_processes_namespace_idx ON relay_outbox_processes (namespace);
