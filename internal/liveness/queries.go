package liveness

// All of the SQL of relay_processes. Table and the liveness rule
// (relay_process_live): migrations/*_processes.tx.up.sql.

// sqlRegister records (or refreshes) a process. A refresh keeps the first
// started_at: the process is the same one, taken for dead a while.
const sqlRegister = `
INSERT INTO relay_processes (id, role, name, namespace, declares, host, pid, version, queues, liveness_secs)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (id) DO UPDATE SET
    role = excluded.role, name = excluded.name, namespace = excluded.namespace,
    declares = excluded.declares, queues = excluded.queues,
    liveness_secs = excluded.liveness_secs, heartbeat_at = now()`

// sqlHeartbeat renews the process's entry and sweeps up to $2 expired ones
// (of any role) in one statement. The entry is renewed only while it is
// still live: one that expired (a process paused longer than its timeout)
// may already count as gone to the others (its declarations retired), so
// it registers again instead — the first column is then 0. The sweep's
// DELETE reads the snapshot before the renewal and leaves this process's
// own entry to it; a concurrent renewal of an entry it picked wins (the
// ctid no longer matches the new row version).
const sqlHeartbeat = `
WITH beat AS (
    UPDATE relay_processes SET heartbeat_at = now()
    WHERE id = $1 AND relay_process_live(heartbeat_at, liveness_secs)
    RETURNING 1
), swept AS (
    DELETE FROM relay_processes WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM relay_processes
        WHERE id <> $1 AND NOT relay_process_live(heartbeat_at, liveness_secs)
        LIMIT $2))
    RETURNING 1
)
SELECT (SELECT count(*) FROM beat), (SELECT count(*) FROM swept)`

// sqlUnregister removes the process at Stop: it no longer serves anything,
// and its declarations no longer keep anything alive.
const sqlUnregister = `DELETE FROM relay_processes WHERE id = $1`

// sqlLockNamespace serializes the declarations and heartbeats (with their
// retirements) of one role's namespace, so that a retirement never misses
// a declaration committed while it ran.
const sqlLockNamespace = `SELECT pg_advisory_xact_lock(hashtext('relay.' || $1 || ':' || $2))`

// sqlLockNames serializes the declarations of the names $2 of role $1
// across namespaces (the namespace lock covers only one): a declaration's
// upsert then starts after a concurrent one of the same name has
// committed, so its snapshot sees that owner's live process and refuses
// instead of taking the name over. Locks are taken in one order (by key),
// so that two declarations of overlapping sets do not deadlock; the
// two-key form keeps them apart from the namespace locks.
const sqlLockNames = `
SELECT pg_advisory_xact_lock(hashtext('relay.' || $1 || '.name'), k)
FROM (SELECT DISTINCT hashtext(n) AS k FROM unnest($2::text[]) AS n) AS keys
ORDER BY k`

// sqlList is every live entry, by role, host and start.
const sqlList = `
SELECT id, role, name, namespace, declares, host, pid, version, queues, started_at, heartbeat_at,
       liveness_secs, heartbeat_at + make_interval(secs => liveness_secs)
FROM relay_processes WHERE relay_process_live(heartbeat_at, liveness_secs)
ORDER BY role, host, started_at, id`
