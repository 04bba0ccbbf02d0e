-- A step's heartbeat details (workflow.Heartbeat): the progress its
-- latest attempt recorded, which the next attempt reads back
-- (workflow.HeartbeatDetails). One row per run and step position, written
-- under the run job's lease; deleted with the run.
CREATE TABLE relay_workflow_heartbeats (
    run_id   text        NOT NULL REFERENCES relay_workflow_runs (id) ON DELETE CASCADE,
    position integer     NOT NULL,
    key      text        NOT NULL,
    attempt  integer     NOT NULL,
    details  jsonb       NOT NULL,
    at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, position)
);
