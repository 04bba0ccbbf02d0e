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
