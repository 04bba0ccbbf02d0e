CREATE TABLE prove_attempts (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL,
    attempt    integer     NOT NULL,
    worker     text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at   timestamptz
);
CREATE INDEX ON prove_attempts (job_id);
CREATE TABLE prove_effects (
    job_id     bigint NOT NULL,
    attempt_id bigint NOT NULL
);
CREATE TABLE prove_kills (
    worker text        NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
