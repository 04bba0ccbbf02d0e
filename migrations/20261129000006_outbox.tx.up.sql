-- Transactional outbox: events published by business transactions, moved
-- into jobs (one per subscriber) by a dispatcher.

CREATE TABLE relay_outbox (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic         text        NOT NULL CHECK (topic <> '' AND length(topic) <= 200),
    -- Events with the same key reach each subscriber in publish order.
    key           text        CHECK (key IS NULL OR (key <> '' AND length(key) <= 500)),
    payload       jsonb       NOT NULL,
    headers       jsonb       NOT NULL DEFAULT '{}',
    published_at  timestamptz NOT NULL DEFAULT now(),
    -- Set, with the number of jobs made (0: no subscriber), in the same
    -- transaction that enqueues the event's jobs.
    dispatched_at timestamptz,
    jobs          integer,
    CHECK ((dispatched_at IS NULL) = (jobs IS NULL))
);

-- The dispatcher's queue: undispatched events in publish order.
CREATE INDEX relay_outbox_pending_idx ON relay_outbox (id) WHERE dispatched_at IS NULL;

-- Wake the dispatchers when events commit.
CREATE FUNCTION relay_outbox_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('relay_outbox', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER relay_outbox_after_insert
    AFTER INSERT ON relay_outbox
    FOR EACH STATEMENT
    EXECUTE FUNCTION relay_outbox_after_insert();
