-- Workflow updates (workflow.Update, workflow.HandleUpdate): a caller's
-- request into a running run, handled by the run at a HandleUpdate of its
-- name and answered here. A request is pending until the run records its
-- answer (completed, with response or error) in the transaction that
-- checkpoints the update, or refuses it (rejected: it did not decode into
-- the handler's type, or its validator refused it). The partial index
-- holds only the pending requests, the ones a run looks for.
CREATE TABLE relay_workflow_updates (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id     text        NOT NULL REFERENCES relay_workflow_runs (id) ON DELETE CASCADE,
    name       text        NOT NULL,
    request    jsonb       NOT NULL,
    state      text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'completed', 'rejected')),
    response   jsonb,
    error      text,
    created_at timestamptz NOT NULL DEFAULT now(),
    handled_at timestamptz
);
CREATE INDEX relay_workflow_updates_pending_idx ON relay_workflow_updates (run_id, name, id) WHERE state = 'pending';
CREATE INDEX relay_workflow_updates_run_idx ON relay_workflow_updates (run_id);
