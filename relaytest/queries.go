package relaytest

// The SQL of relaytest, in one place.

// sqlClaim claims job $1 for relaytest with lease token $2 (text), as the
// client's claim does: the attempt counts, the lease lasts an hour.
const sqlClaim = `
UPDATE relay_jobs
SET state = 'claimed', attempt = attempt + 1, attempted_at = now(), attempted_by = 'relaytest',
    lease_token = $2::uuid, lease_expires_at = now() + interval '1 hour'
WHERE id = $1 AND state = 'queued'`
