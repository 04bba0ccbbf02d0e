-- Runs that failed before retry_from existed (20261202010001) get the
-- resume point Retry used to compute for them: the last step that failed,
-- unless the run failed in its compensations (Retry then drops only the
-- failed compensations, whatever retry_from holds). Retry's rule that
-- nothing at or before a completed StepTx or consumed signal wait is
-- dropped still applies, so such a run never runs a StepTx again; a run
-- failed since has its retry_from recorded by its failure, and one with
-- none recorded (a crash loop, an error of the function's own) keeps NULL
-- only if it failed after this ran.
UPDATE relay_workflow_runs AS r
SET retry_from = (SELECT max(s.position) FROM relay_workflow_steps AS s WHERE s.run_id = r.id AND s.state = 'failed')
WHERE r.state = 'failed' AND r.retry_from IS NULL
  AND NOT EXISTS (SELECT 1 FROM relay_workflow_steps AS c
                  WHERE c.run_id = r.id AND c.kind = 'step' AND starts_with(c.key, 'compensate:'));
