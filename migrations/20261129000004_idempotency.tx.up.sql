-- Idempotency keys: one row per (scope, key) whose effect was made, or is
-- being made.

CREATE TABLE relay_idempotency_keys (
    scope            text        NOT NULL CHECK (scope <> '' AND length(scope) <= 200),
    key              text        NOT NULL CHECK (key <> '' AND length(key) <= 500),
    -- running: an effect is under way (the external helper commits this
    -- before calling out, the database helper only inside its transaction);
    -- succeeded: made, and result holds what it returned.
    status           text        NOT NULL CHECK (status IN ('running', 'succeeded')),
    result           jsonb,
    -- The stable token handed to an outside service with every attempt at
    -- this key's effect.
    token            uuid        NOT NULL DEFAULT gen_random_uuid(),
    -- Who holds a running key, and until when: another attempt may take the
    -- key over once the lease has expired.
    owner            uuid,
    lease_expires_at timestamptz,
    -- The HTTP middleware's request fingerprint (method, path, body).
    request_hash     text,
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key),
    CONSTRAINT relay_idempotency_running_has_lease
        CHECK ((status = 'running') = (owner IS NOT NULL)),
    CONSTRAINT relay_idempotency_succeeded_has_result
        CHECK (status <> 'succeeded' OR result IS NOT NULL)
);

-- Cleanup: expired keys, by expiry.
CREATE INDEX relay_idempotency_keys_expires_idx ON relay_idempotency_keys (expires_at);
