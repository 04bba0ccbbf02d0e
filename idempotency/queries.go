package idempotency

// All of the package's SQL. Table: migrations/*_idempotency.tx.up.sql.

// sqlClaim inserts a key as running for owner $3, unless it exists. The
// insert waits for a concurrent transaction holding the same key to end, so
// a second caller sees the first one's outcome, never a half-made effect.
// A key never expires before its lease ends: expiry is the later of the TTL
// ($6) and the lease ($4).
const sqlClaim = `
INSERT INTO relay_idempotency_keys (scope, key, status, owner, lease_expires_at, request_hash, expires_at)
VALUES ($1, $2, 'running', $3, now() + make_interval(secs => $4), $5, now() + make_interval(secs => greatest($4, $6)))
ON CONFLICT (scope, key) DO NOTHING
RETURNING token`

// sqlLock reads an existing key under a row lock, with the database's
// verdict on its lease and expiry.
const sqlLock = `
SELECT status, result, token, coalesce(request_hash, ''),
       coalesce(lease_expires_at < now(), true) AS lease_expired,
       coalesce(extract(epoch FROM lease_expires_at - now()), 0)::float8 AS lease_left,
       expires_at < now() AS expired
FROM relay_idempotency_keys WHERE scope = $1 AND key = $2
FOR UPDATE`

// sqlTakeOver makes owner $3 the holder of a key whose lease expired (or a
// succeeded key which expired altogether: then the token is fresh too, $7).
// A running key under a live lease is never taken over, whatever its
// expiry says.
const sqlTakeOver = `
UPDATE relay_idempotency_keys SET
    status = 'running', result = NULL, owner = $3,
    lease_expires_at = now() + make_interval(secs => $4),
    request_hash = $5,
    expires_at = now() + make_interval(secs => greatest($4, $6)),
    token = CASE WHEN $7 THEN gen_random_uuid() ELSE token END,
    updated_at = now()
WHERE scope = $1 AND key = $2
RETURNING token`

// sqlSucceed records a key's result, fenced by its owner.
const sqlSucceed = `
UPDATE relay_idempotency_keys SET
    status = 'succeeded', result = $4, owner = NULL, lease_expires_at = NULL,
    expires_at = now() + make_interval(secs => $5), updated_at = now()
WHERE scope = $1 AND key = $2 AND owner = $3`

// sqlRelease gives up a running key after a failed attempt, so the next
// attempt need not wait out the lease, and keeps it for the TTL ($4) from
// now: the call may have reached the service, and the retry must get the
// same token, not find the key swept as expired.
const sqlRelease = `
UPDATE relay_idempotency_keys SET lease_expires_at = now(),
    expires_at = greatest(expires_at, now() + make_interval(secs => $4)), updated_at = now()
WHERE scope = $1 AND key = $2 AND owner = $3 AND status = 'running'`

// sqlForget removes a running key (the database helper's function failed,
// or an HTTP handler answered with a server error): nothing was made.
const sqlForget = `
DELETE FROM relay_idempotency_keys WHERE scope = $1 AND key = $2 AND owner = $3 AND status = 'running'`

// sqlDeleteExpired removes up to $1 expired keys (never one under a live
// lease). Rows another transaction holds are skipped, not waited for: the
// helpers run this inside their callers' transactions.
const sqlDeleteExpired = `
DELETE FROM relay_idempotency_keys WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM relay_idempotency_keys
    WHERE expires_at < now() AND (lease_expires_at IS NULL OR lease_expires_at < now())
    ORDER BY expires_at LIMIT $1
    FOR UPDATE SKIP LOCKED))`
