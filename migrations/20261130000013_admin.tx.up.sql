-- Admin: paused queues (read by the core's claim) and the audit log of
-- admin writes.

-- A queue with a row here is paused: the claim statement (core/queries.go,
-- sqlClaim) takes nothing from it, so every worker process stops starting
-- its jobs at its next claim — within one poll interval, or at once when a
-- notification wakes it. Jobs already running finish normally. Resuming
-- deletes the row and wakes the queue's workers.
CREATE TABLE relay_queue_pauses (
    queue      text        PRIMARY KEY CHECK (queue <> '' AND length(queue) <= 128),
    paused_at  timestamptz NOT NULL DEFAULT now(),
    paused_by  text        NOT NULL DEFAULT ''
);

-- One row per admin write, inserted in the transaction that made the change
-- (see admin/audit.go): who (the token's subject), what (the action), on
-- what (ids or the filter, as JSON), how many rows changed, when.
CREATE TABLE relay_admin_audit (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    subject      text        NOT NULL,
    action       text        NOT NULL,
    target       jsonb       NOT NULL DEFAULT '{}',
    rows_changed bigint      NOT NULL DEFAULT 0
);
