-- The proof tables and audit of `relay prove workflow`. Each audit query
-- returns one number; the summary line prints them. The proof's own tables
-- (in the proof's schema, beside the workflow tables):
--   prove_wf_execs    one row per execution of any run (parent or child),
--                     written on its own connection as the workflow function
--                     is entered (committed whatever happens next)
--   prove_wf_effects  the database effects, each written inside a StepTx
--                     (so it commits only with that step's checkpoint):
--                     payment, email, report, notify, refund; run_id is the
--                     top-level run's id
--   prove_wf_tried    one row per StepTx body that reached its end, written
--                     on its own connection just before the body returns
--                     (the transaction may still be refused or killed)
--   prove_wf_sink     every call the sink (in the prover's process) received
--   prove_wf_asks     a run asking for its approval signal
--   prove_wf_signals  the approvals the prover sent
--   prove_wf_updates  the address updates the prover sent (in the
--                     approval's transaction), with the answer it got
--                     once every run was final, or its error
--   prove_kills       when each worker process was sent SIGKILL
--   prove_wf_ledger   one row: whether the ledger is down (--retry-failed:
--                     until the faults are over)
--   prove_wf_cancel_targets  the runs --cancel-every cancels, and at which
--                     point of their path
--   prove_wf_cancels  each cancel the prover made, in the transaction of
--                     workflow.Cancel: accepted (Cancel returned nil) or not
--                     (the run had finished)
--   prove_wf_retries  each workflow.Retry the prover made, in its
--                     transaction, with the error the run had failed with

-- name: schema
CREATE TABLE prove_wf_execs (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id     text        NOT NULL,
    worker     text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON prove_wf_execs (run_id);
CREATE TABLE prove_wf_effects (
    run_id    text        NOT NULL,
    kind      text        NOT NULL,
    exec_id   bigint      NOT NULL,
    step_run  text        NOT NULL, -- the run whose step wrote it (a child's id for email and report)
    at        timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON prove_wf_effects (run_id, kind);
CREATE TABLE prove_wf_tried (
    run_id  text        NOT NULL,
    kind    text        NOT NULL,
    exec_id bigint      NOT NULL,
    worker  text        NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE prove_wf_sink (
    run_id text        NOT NULL,
    kind   text        NOT NULL,
    token  text        NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON prove_wf_sink (run_id, kind);
CREATE TABLE prove_wf_asks (
    run_id text        NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE prove_wf_signals (
    run_id text        PRIMARY KEY,
    early  boolean     NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE prove_wf_updates (
    run_id    text   PRIMARY KEY,
    update_id bigint NOT NULL,
    address   text   NOT NULL,
    answer    text,
    error     text
);
CREATE TABLE prove_wf_ledger (
    down boolean NOT NULL
);
CREATE TABLE prove_wf_cancel_targets (
    run_id text PRIMARY KEY,
    stage  text NOT NULL
);
CREATE TABLE prove_wf_cancels (
    run_id   text        PRIMARY KEY,
    stage    text        NOT NULL,
    accepted boolean     NOT NULL,
    error    text,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE prove_wf_retries (
    run_id text        NOT NULL,
    error  text        NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS prove_kills (
    worker text        NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- name: runs
SELECT count(*) FROM relay_workflow_runs WHERE workflow = 'prove.payment';

-- name: completed
SELECT count(*) FROM relay_workflow_runs WHERE workflow = 'prove.payment' AND state = 'completed';

-- name: compensated
SELECT count(*) FROM relay_workflow_runs WHERE workflow = 'prove.payment' AND state = 'compensated';

-- name: cancelled
SELECT count(*) FROM relay_workflow_runs WHERE workflow = 'prove.payment' AND state = 'cancelled';

-- name: failed
SELECT count(*) FROM relay_workflow_runs WHERE workflow = 'prove.payment' AND state = 'failed';

-- stalled: runs not final when the prover stopped waiting (a bound after
-- the last fault).
-- name: stalled
SELECT count(*) FROM relay_workflow_runs
WHERE workflow = 'prove.payment' AND state NOT IN ('completed', 'failed', 'compensated', 'cancelled');

-- lost: a final run whose outcome or effects are not what its input asked
-- for (the runs the prover cancelled are audited by cancel_violations). A
-- run meant to complete must have its payment, both children's effects,
-- both sink sends and its notification, and no refund; a run meant to fail
-- in report must have ended compensated with its payment refunded and no
-- notification; an outage run (the ledger, retried) must have completed
-- with its payment and its credit, and no refund. A run that ended failed
-- or cancelled lost its outcome.
-- name: lost
WITH r AS (
    SELECT id, state, (input->>'fail')::boolean AS fail, coalesce((input->>'outage')::boolean, false) AS outage,
           (SELECT array_agg(DISTINCT kind) FROM prove_wf_effects e WHERE e.run_id = r.id) AS kinds,
           (SELECT array_agg(DISTINCT kind) FROM prove_wf_sink s WHERE s.run_id = r.id) AS sent
    FROM relay_workflow_runs r
    WHERE workflow = 'prove.payment' AND state IN ('completed', 'failed', 'compensated', 'cancelled')
      AND NOT EXISTS (SELECT 1 FROM prove_wf_cancels c WHERE c.run_id = r.id AND c.accepted)
)
SELECT count(*) FROM r
WHERE state IN ('failed', 'cancelled')
   OR (outage AND NOT (state = 'completed'
                       AND coalesce(kinds, '{}') @> '{payment,credit}'
                       AND NOT coalesce(kinds, '{}') @> '{refund}'))
   OR (NOT fail AND NOT outage AND NOT (state = 'completed'
                         AND coalesce(kinds, '{}') @> '{payment,email,report,notify}'
                         AND NOT coalesce(kinds, '{}') @> '{refund}'
                         AND coalesce(sent, '{}') @> '{email,report}'))
   OR (fail AND NOT (state = 'compensated'
                     AND coalesce(kinds, '{}') @> '{payment,refund}'
                     AND NOT coalesce(kinds, '{}') @> '{notify}'
                     AND NOT coalesce(kinds, '{}') @> '{report}'));

-- duplicate_tx_effects: effects beyond one per run and kind.
-- name: duplicate_tx_effects
SELECT count(*) - count(DISTINCT (run_id, kind)) FROM prove_wf_effects;

-- forked_runs: runs (parents or children) with two executions whose
-- checkpoint windows overlap. An execution's checkpoint window runs from
-- the first to the last StepTx effect it committed; executions of one run
-- take turns (a late execution's checkpoints are refused by the lease
-- fence), so two windows of one run never overlap.
-- name: forked_runs
WITH w AS (
    SELECT e.step_run, e.exec_id, min(e.at) AS first_at, max(e.at) AS last_at
    FROM prove_wf_effects e
    GROUP BY e.step_run, e.exec_id
)
SELECT count(DISTINCT a.step_run)
FROM w a JOIN w b ON a.step_run = b.step_run AND a.exec_id < b.exec_id
WHERE a.first_at <= b.last_at AND b.first_at <= a.last_at;

-- late_checkpoints_refused is not an error: StepTx bodies that reached
-- their end in an execution whose transaction then did not commit although
-- its process was never killed (a worker paused past its lease: the fence
-- refused its checkpoint and the effect with it).
-- name: late_checkpoints_refused
SELECT count(*)
FROM prove_wf_tried t
WHERE NOT EXISTS (SELECT 1 FROM prove_wf_effects e WHERE e.exec_id = t.exec_id AND e.kind = t.kind)
  AND NOT EXISTS (SELECT 1 FROM prove_kills k WHERE k.worker = t.worker AND k.at >= t.at);

-- order_violations: runs with an effect before the effect it depends on:
-- a child's effect or a sink send before the payment; the notification
-- before either child's effect; a refund or a credit before the payment.
-- name: order_violations
WITH f AS (
    SELECT run_id,
           min(at) FILTER (WHERE kind = 'payment') AS payment,
           min(at) FILTER (WHERE kind = 'email')   AS email,
           min(at) FILTER (WHERE kind = 'report')  AS report,
           min(at) FILTER (WHERE kind = 'notify')  AS notify,
           min(at) FILTER (WHERE kind = 'refund')  AS refund,
           min(at) FILTER (WHERE kind = 'credit')  AS credit
    FROM prove_wf_effects GROUP BY run_id
), s AS (
    SELECT run_id, min(at) AS first_send FROM prove_wf_sink GROUP BY run_id
)
SELECT count(*)
FROM relay_workflow_runs r
LEFT JOIN f ON f.run_id = r.id
LEFT JOIN s ON s.run_id = r.id
WHERE r.workflow = 'prove.payment'
  AND (   ((f.email IS NOT NULL OR f.report IS NOT NULL OR s.first_send IS NOT NULL) AND f.payment IS NULL)
       OR f.email < f.payment OR f.report < f.payment OR s.first_send < f.payment
       OR (f.notify IS NOT NULL AND (f.email IS NULL OR f.report IS NULL OR f.notify < f.email OR f.notify < f.report))
       OR (f.refund IS NOT NULL AND (f.payment IS NULL OR f.refund < f.payment))
       OR (f.credit IS NOT NULL AND (f.payment IS NULL OR f.credit < f.payment)));

-- sends_with_two_tokens: sink sends (run and kind) that arrived with more
-- than one idempotency token (repeats with the same token are the
-- at-least-once window of an inline step, and the sink's to collapse).
-- name: sends_with_two_tokens
SELECT count(*) FROM (SELECT 1 FROM prove_wf_sink GROUP BY run_id, kind HAVING count(DISTINCT token) > 1) x;

-- name: sink_calls
SELECT count(*) FROM prove_wf_sink;

-- name: executions
SELECT count(*) FROM prove_wf_execs;

-- name: early_signals
SELECT count(*) FROM prove_wf_signals WHERE early;

-- name: cancels
SELECT count(*) FROM prove_wf_cancels;

-- name: cancels_accepted
SELECT count(*) FROM prove_wf_cancels WHERE accepted;

-- name: cancel_stages_accepted
SELECT count(DISTINCT stage) FROM prove_wf_cancels WHERE accepted;

-- cancel_violations: runs whose cancel was accepted (workflow.Cancel
-- returned nil) that did not end cancelled with their compensation: a
-- run charged must have been refunded, once (duplicate_tx_effects counts
-- twice), and nothing is refunded that was not charged.
-- name: cancel_violations
WITH r AS (
    SELECT r.id, r.state,
           (SELECT array_agg(DISTINCT kind) FROM prove_wf_effects e WHERE e.run_id = r.id) AS kinds
    FROM prove_wf_cancels c JOIN relay_workflow_runs r ON r.id = c.run_id
    WHERE c.accepted
)
SELECT count(*) FROM r
WHERE state <> 'cancelled'
   OR (coalesce(kinds, '{}') @> '{payment}' AND NOT coalesce(kinds, '{}') @> '{refund}')
   OR (coalesce(kinds, '{}') @> '{refund}' AND NOT coalesce(kinds, '{}') @> '{payment}');

-- name: retried
SELECT count(DISTINCT run_id) FROM prove_wf_retries;

-- retry_violations: runs the prover retried that did not end as their
-- input asked (an outage or plain run completed, a run failing in report
-- compensated, a run whose cancel was accepted cancelled), or that hold a
-- StepTx effect more than once: a Retry never runs a completed StepTx
-- again.
-- name: retry_violations
WITH t AS (SELECT DISTINCT run_id FROM prove_wf_retries)
SELECT count(*)
FROM t JOIN relay_workflow_runs r ON r.id = t.run_id
WHERE r.state <> CASE
        WHEN EXISTS (SELECT 1 FROM prove_wf_cancels c WHERE c.run_id = r.id AND c.accepted) THEN 'cancelled'
        WHEN (r.input->>'fail')::boolean THEN 'compensated'
        ELSE 'completed' END
   OR EXISTS (SELECT 1 FROM prove_wf_effects e WHERE e.run_id = r.id GROUP BY e.kind HAVING count(*) > 1);

-- name: updates
SELECT count(*) FROM prove_wf_updates WHERE answer IS NOT NULL;

-- update_violations: payment runs whose address update was lost, applied
-- twice or answered wrongly across the kills, one row each, naming the run
-- and what its counts were. A run meant to take one that completed must
-- have been sent exactly one, answered with its address (the prover's
-- record of the answer, and the update's row in relay_workflow_updates),
-- applied once (one address effect, written in the handler's StepTx) and
-- recorded once in its history (update:address#1); an update answered at
-- all, by the prover's record or by its row, must have been answered
-- right, applied and recorded once; a run not meant to take one holds
-- none. The proof's count is the number of rows.
-- name: update_violations
WITH u AS (
    SELECT r.id, r.state, coalesce((r.input->>'update')::boolean, false) AS wants,
           (SELECT count(*) FROM prove_wf_updates p WHERE p.run_id = r.id) AS sent,
           (SELECT count(*) FROM prove_wf_updates p WHERE p.run_id = r.id AND p.answer IS NOT NULL) AS answered,
           (SELECT count(*) FROM prove_wf_updates p WHERE p.run_id = r.id AND p.answer = 'applied ' || p.address) AS answered_right,
           (SELECT count(*) FROM relay_workflow_updates x WHERE x.run_id = r.id AND x.state <> 'pending') AS stored,
           (SELECT count(*) FROM relay_workflow_updates x JOIN prove_wf_updates p ON p.update_id = x.id
            WHERE x.run_id = r.id AND x.name = 'address' AND x.state = 'completed' AND x.error IS NULL
              AND x.response = to_jsonb('applied ' || p.address)) AS stored_right,
           (SELECT count(*) FROM prove_wf_effects e WHERE e.run_id = r.id AND e.kind = 'address') AS applied,
           (SELECT count(*) FROM relay_workflow_steps s WHERE s.run_id = r.id AND s.key LIKE 'update:address#%' AND s.state = 'completed') AS recorded
    FROM relay_workflow_runs r
    WHERE r.workflow = 'prove.payment'
)
SELECT id, format('state=%s wants=%s sent=%s answered=%s answered_right=%s stored=%s stored_right=%s applied=%s recorded=%s',
                  state, wants, sent, answered, answered_right, stored, stored_right, applied, recorded)
FROM u
WHERE (wants AND state = 'completed' AND NOT (sent = 1 AND answered_right = 1 AND stored_right = 1 AND applied = 1 AND recorded = 1))
   OR ((answered > 0 OR stored > 0) AND NOT (answered_right = 1 AND stored = 1 AND stored_right = 1 AND applied = 1 AND recorded = 1))
   OR (NOT wants AND (sent > 0 OR stored > 0 OR applied > 0 OR recorded > 0))
ORDER BY id;
