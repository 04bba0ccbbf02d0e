-- Relay scheduler: cron schedules and the record of their fires.

-- One row per schedule declared in code. Any scheduler process may fire any
-- enabled row: the row, not the process, says what to enqueue.
CREATE TABLE relay_schedules (
    name           text        PRIMARY KEY CHECK (name <> '' AND length(name) <= 200),
    spec           text        NOT NULL,
    -- IANA zone the spec's wall-clock fields are read in.
    timezone       text        NOT NULL,
    -- What each fire enqueues (core.EnqueueOpts, minus the timing).
    kind           text        NOT NULL,
    args           jsonb       NOT NULL,
    queue          text        NOT NULL,
    priority       integer     NOT NULL,
    max_attempts   integer     NOT NULL,
    metadata       jsonb       NOT NULL DEFAULT '{}',
    catch_up       text        NOT NULL CHECK (catch_up IN ('latest', 'skip', 'all')),
    catch_up_limit integer     NOT NULL CHECK (catch_up_limit >= 0),
    overlap        text        NOT NULL CHECK (overlap IN ('allow', 'skip')),
    -- The first fire not yet handled. A scheduler fires the row when this is
    -- at or before the database's now(), and advances it in the same
    -- transaction as the enqueue.
    next_fire_at   timestamptz NOT NULL,
    last_fire_at   timestamptz,
    last_job_id    bigint,
    paused         boolean     NOT NULL DEFAULT false,
    -- Set when a process starts without declaring this schedule.
    disabled_at    timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Due check: the enabled schedules by next fire.
CREATE INDEX relay_schedules_due_idx ON relay_schedules (next_fire_at)
    WHERE NOT paused AND disabled_at IS NULL;

-- One row per fire handled. The primary key is the exactly-once guarantee:
-- a second enqueue for the same (schedule, fire time) cannot commit, however
-- the processes that attempt it were scheduled.
CREATE TABLE relay_schedule_fires (
    schedule    text        NOT NULL REFERENCES relay_schedules (name) ON DELETE CASCADE,
    fire_time   timestamptz NOT NULL,
    -- enqueued: the fire's job is job_id; skipped_overlap: the previous run
    -- was still queued or running (job_id is null); triggered: run by hand
    -- (TriggerNow).
    outcome     text        NOT NULL CHECK (outcome IN ('enqueued', 'skipped_overlap', 'triggered')),
    job_id      bigint,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, fire_time)
);

-- Retention of the fire record, by age.
CREATE INDEX relay_schedule_fires_recorded_idx ON relay_schedule_fires (recorded_at);
