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

// sqlMarkUndecodable records, for the events $1, the stored value that did
// not decode ($3). An event failed ($2) is also marked handled with no jobs,
// so no dispatcher reads it again; the others are dispatched by
// sqlMarkDispatched in the same transaction.
const sqlMarkUndecodable = `
UPDATE relay_outbox AS o SET
    dispatch_error = d.err,
    failed_at      = CASE WHEN d.failed THEN now() END,
    dispatched_at  = CASE WHEN d.failed THEN now() ELSE o.dispatched_at END,
    jobs           = CASE WHEN d.failed THEN 0 ELSE o.jobs END
FROM unnest($1::bigint[], $2::bool[], $3::text[]) AS d(id, failed, err)
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

// sqlDeclareSubscription upserts one declared subscription and un-retires
// it. A subscription of another namespace ($9) is taken over only when no
// live process of that namespace declares it (live: within that process's
// own liveness timeout of its last heartbeat); otherwise nothing is written
// and no row returns.
const sqlDeclareSubscription = `
INSERT INTO relay_outbox_subscriptions AS s
    (id, topic, kind, endpoint, queue, priority, max_attempts, metadata, namespace)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (id) DO UPDATE SET
    queue = excluded.queue, priority = excluded.priority,
    max_attempts = excluded.max_attempts, metadata = excluded.metadata,
    namespace = excluded.namespace, retired_at = NULL, updated_at = now()
WHERE s.namespace = excluded.namespace OR NOT EXISTS (
    SELECT 1 FROM relay_processes p
    WHERE p.role = 'dispatcher' AND p.namespace = s.namespace AND s.id = ANY (p.declares)
      AND relay_process_live(p.heartbeat_at, p.liveness_secs))
RETURNING id`

const sqlSubscriptionOwner = `SELECT namespace FROM relay_outbox_subscriptions WHERE id = $1`

// sqlRetire retires the namespace's subscriptions no live process declares.
// Run under the namespace's lock (internal/liveness), where a heartbeat that
// finds its dispatcher expired declares again.
const sqlRetire = `
UPDATE relay_outbox_subscriptions s SET retired_at = now(), updated_at = now()
WHERE s.namespace = $1 AND s.retired_at IS NULL AND NOT EXISTS (
    SELECT 1 FROM relay_processes p
    WHERE p.role = 'dispatcher' AND p.namespace = s.namespace AND s.id = ANY (p.declares)
      AND relay_process_live(p.heartbeat_at, p.liveness_secs))
RETURNING topic, kind, endpoint`

// sqlActiveSubscriptions is the fan-out, read in the dispatch transaction:
// every dispatcher uses the same stored set.
const sqlActiveSubscriptions = `
SELECT topic, kind, endpoint, queue, priority, max_attempts, metadata
FROM relay_outbox_subscriptions WHERE retired_at IS NULL
ORDER BY topic, id`

// sqlListSubscriptions is every stored subscription, for Subscriptions.
const sqlListSubscriptions = `
SELECT namespace, topic, kind, endpoint, queue, priority, max_attempts, metadata, created_at, retired_at
FROM relay_outbox_subscriptions ORDER BY topic, id`

// sqlNameSession sets application_name for the rest of the transaction
// (transaction-local: nothing outlives it, through a transaction-pooling
// proxy included).
const sqlNameSession = `SELECT set_config('application_name', $1, true)`
