-- A signal whose payload does not decode into the type its WaitSignal
-- asks for is set aside instead of failing the run (docs/workflow.md, bad
-- input): it leaves the mailbox (consumed_at set, consumed_by NULL: no
-- wait received it) with the decoding error here, in the transaction of
-- the wait that met it, and the wait goes on with the next signal. A
-- constant default (NULL): no table rewrite.
--
-- The admin API lists a run's set-aside signals by the partial index,
-- which holds only them (a handful, if any). This file runs outside a
-- transaction (no .tx in its name), in parts cut at the --bun:split line,
-- so that the index is built CONCURRENTLY: signals go on being sent and
-- consumed during the build. Each part can run again after a failure.
ALTER TABLE relay_workflow_signals ADD COLUMN IF NOT EXISTS decode_error text;
--bun:split
DROP INDEX CONCURRENTLY IF EXISTS relay_workflow_signals_set_aside_idx;
--bun:split
CREATE INDEX CONCURRENTLY relay_workflow_signals_set_aside_idx ON relay_workflow_signals (run_id, id)
    WHERE decode_error IS NOT NULL;
