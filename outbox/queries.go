package outbox

// All of the outbox's SQL. Table: migrations/*_outbox.tx.up.sql.

// sqlPublish inserts one event. An event with a key first takes a
// transaction-level advisory lock on its key, before its id is drawn:
// publishers of one key serialise, so ids (the dispatch order) follow
// commit order within a key. Without it, an earlier id could commit after
// a later one had been dispatched, and the key's order would break. The
// parameters are text so that any driver can pass them.
const sqlPublish = `
INSERT INTO relay_outbox (topic, key, payload, headers, trace_context)
SELECT $1::text, nullif($2::text, ''), $3::jsonb, $4::jsonb, nullif($5::text, '')::jsonb
FROM (SELECT CASE WHEN $2::text <> ''
             THEN pg_advisory_xact_lock(hashtextextended('relay_outbox|' || $2::text, 0)) END) AS serialise
RETURNING id`

// sqlDispatchLock lets one dispatcher at a time move events, so that the
// jobs of each key are enqueued in event order across batches. Others find
// it taken and wait for the next wake-up; it is released at commit.
const sqlDispatchLock = `SELECT pg_try_advisory_xact_lock(hashtextextended('relay_outbox|dispatch', 0))`

// sqlPending reads the next undispatched events in publish order.
const sqlPending = `
SELECT id, topic, coalesce(key, ''), payload, headers, published_at, coalesce(trace_context, '{}')
FROM relay_outbox WHERE dispatched_at IS NULL
ORDER BY id LIMIT $1`

// sqlMarkDispatched records the jobs made for each event ($1 ids, $2
// counts).
const sqlMarkDispatched = `
UPDATE relay_outbox AS o SET dispatched_at = now(), jobs = d.jobs
FROM unnest($1::bigint[], $2::int[]) AS d(id, jobs)
WHERE o.id = d.id AND o.dispatched_at IS NULL`

// sqlUndispatched counts events waiting, for Stats and tests.
const sqlUndispatched = `SELECT count(*) FROM relay_outbox WHERE dispatched_at IS NULL`

// sqlDeleteDispatched removes up to $2 events dispatched more than $1
// seconds ago. Undispatched events are never deleted.
const sqlDeleteDispatched = `
DELETE FROM relay_outbox WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM relay_outbox
    WHERE dispatched_at < now() - make_interval(secs => $1)
    LIMIT $2))`
