-- Each scheduler and dispatcher process records its own liveness timeout:
-- a process is dead when its own timeout has passed since its heartbeat, so
-- a process configured with a short timeout no longer sweeps (and retires
-- the schedules and subscriptions of) a live one that heartbeats less often.
ALTER TABLE relay_scheduler_processes ADD COLUMN liveness_secs float8 NOT NULL DEFAULT 60;
ALTER TABLE relay_outbox_processes ADD COLUMN liveness_secs float8 NOT NULL DEFAULT 60;
