package jobinsert

import "strconv"

// The insert statements are written once, in insertSQL, and their variants
// are that one text with named parts filled in (the relation the ids come
// from, the parameter, the notify mode, RETURNING): a variant cannot drift
// from the statement it varies, as a copy can, and unlike a text
// replacement it cannot silently match nothing.

// Notify says how an insert's trigger wakes the queue's workers.
type Notify bool

const (
	// NotifyAtCommit: the insert trigger's NOTIFY rides on the caller's
	// transaction and is delivered at its commit.
	NotifyAtCommit Notify = false
	// NotifyAfter: the trigger sends nothing (the statement sets
	// relay.notify to 'after' for its transaction, see the migration
	// *_notify_after_commit) and the caller wakes the queue after the
	// commit (Wake). For a statement that is its own transaction:
	// PostgreSQL serialises the commits of transactions that NOTIFY.
	NotifyAfter Notify = true
)

// SQL returns the statement that inserts a batch of jobs given as one JSON
// array ($1, text; AppendBatch). One statement writes one job or ten
// thousand, on any driver, since its only parameter is a string. It
// returns each job's id and false (not a duplicate), in the order given.
// A job's run_at is absolute when given, else database now() plus its
// delay.
func SQL(n Notify) string {
	return insertSQL("", "", "$1", n, "id, false", "", nil)
}

// SQLInto returns the body of a CTE (INSERT … RETURNING id) that inserts
// the one job of parameter $param with the id in column idCol of the
// relation from (a CTE of one row or none: no row, no job). It is the
// enqueue statement of SQL, so the insert goes through relay_jobs'
// triggers and rules as any enqueue's; another layer writes its own row
// and the job in one statement with it.
func SQLInto(from, idCol string, param int, n Notify) string {
	return insertSQL(from, from+"."+idCol, "$"+strconv.Itoa(param), n, "id", "", nil)
}

// Claim names the parameters of SQLIntoClaimed's claim: the worker's id
// (attempted_by, text), the lease token (uuid, as text) and the lease's
// length in milliseconds (bigint).
type Claim struct{ By, Token, LeaseMS int }

// SQLIntoClaimed is SQLInto for a job inserted already claimed, as the
// claim statements would leave it (state claimed, attempt 1, attempted_at
// now(), attempted_by, lease token and expiry from the parameters claim
// names): one row version where an insert and a claim write two. The job
// is inserted queued instead, as SQLInto inserts it, whenever a claim
// would not take it at once: its queue is paused, a global limit names
// its queue, kind or one of its tags (the limits are counted by the
// queues' serialised claims, which this statement cannot join), or it
// has an ordering key or a later run-at. It returns the job's id and its
// attempted_at, NULL when it was inserted queued.
func SQLIntoClaimed(from, idCol string, param int, n Notify, claim Claim) string {
	return insertSQL(from, from+"."+idCol, "$"+strconv.Itoa(param), n, "id, attempted_at", "", &claim)
}

// SQLIntoEach is SQLInto for a batch: the job at position i (from 1) of
// the JSON array $param is inserted, with the id in column idCol, for the
// row of from whose column ordCol is i, if there is one (a row of the
// batch whose own row was not inserted gets no job). It returns each
// inserted job's id.
func SQLIntoEach(from, idCol, ordCol string, param int, n Notify) string {
	return insertSQL(from, from+"."+idCol, "$"+strconv.Itoa(param), n, "id", "\nWHERE j.ord = "+from+"."+ordCol, nil)
}

// insertSQL is the insert statement: ids drawn by relay_jobs' default, or
// taken from idExpr of the relation from (joined by where, if not empty);
// the batch read from param; RETURNING returning; claimed, when claim is
// not nil, where a claim would take it (SQLIntoClaimed).
func insertSQL(from, idExpr, param string, n Notify, returning, where string, claim *Claim) string {
	idCol, idVal, fromRel := "", "", ""
	if idExpr != "" {
		idCol, idVal, fromRel = "id, ", idExpr+", ", from+", "
	}
	claimCols, claimVals, claimJoin := "", "", ""
	if claim != nil {
		by, token, ms := "$"+strconv.Itoa(claim.By), "$"+strconv.Itoa(claim.Token), "$"+strconv.Itoa(claim.LeaseMS)
		claimCols = ",\n                        state, attempt, attempted_at, attempted_by, lease_token, lease_expires_at"
		claimVals = `,
       CASE WHEN c.claim THEN 'claimed' ELSE 'queued' END, CASE WHEN c.claim THEN 1 ELSE 0 END,
       CASE WHEN c.claim THEN now() END, CASE WHEN c.claim THEN ` + by + `::text END,
       CASE WHEN c.claim THEN ` + token + `::uuid END,
       CASE WHEN c.claim THEN now() + ` + ms + `::bigint * interval '1 millisecond' END`
		// The refusals of core's claim of one known job (sqlClaimKnown).
		claimJoin = `
     CROSS JOIN LATERAL (
         SELECT j.ordering_key IS NULL AND j.run_at IS NULL AND coalesce(j.delay_us, 0) <= 0
            AND NOT EXISTS (SELECT 1 FROM relay_queue_pauses AS p WHERE p.queue = j.queue)
            AND NOT EXISTS (SELECT 1 FROM relay_limits AS l
                            WHERE (l.scope = 'queue' AND l.name = j.queue) OR (l.scope = 'kind' AND l.name = j.kind)
                               OR (l.scope = 'tag' AND l.name = ANY (j.tags)))) AS c(claim)`
	}
	return `
INSERT INTO relay_jobs (` + idCol + `kind, queue, args, priority, max_attempts, run_at, metadata, ordering_key, tags` + claimCols + `)
SELECT ` + idVal + `j.kind, j.queue, j.args, j.priority, j.max_attempts,
       coalesce(j.run_at, now() + j.delay_us * interval '1 microsecond'),
       j.metadata, j.ordering_key, coalesce(j.tags, '{}')` + claimVals + `
FROM ` + fromRel + `ROWS FROM (jsonb_to_recordset(` + param + `::jsonb) AS (
         kind text, queue text, args jsonb, priority smallint, max_attempts integer,
         run_at timestamptz, delay_us bigint, metadata jsonb, ordering_key text, tags text[]))
     WITH ORDINALITY AS j(kind, queue, args, priority, max_attempts, run_at, delay_us, metadata, ordering_key, tags, ord)` + notifyJoin(n) + claimJoin + where + `
ORDER BY j.ord
RETURNING ` + returning
}

// notifyJoin is the one-row subquery that sets relay.notify for the
// statement's transaction only (NotifyAfter); the trigger runs at the end
// of the statement, after it.
func notifyJoin(n Notify) string {
	if n == NotifyAtCommit {
		return ""
	}
	return "\n     CROSS JOIN (SELECT set_config('relay.notify', 'after', true)) AS notify_after"
}

// SQLUnique returns SQL's statement for a batch holding unique jobs (keys
// distinct within the batch). A job whose key is held by a job in one of
// that job's unique states is not inserted. ON CONFLICT DO NOTHING takes no
// lock on the existing row: a duplicate enqueued in a long transaction must
// not hold the row of a running job, or that job could neither renew its
// lease nor record its outcome until the transaction ends. (It still waits
// for an enqueue of the same key in flight in another transaction, so the
// answer is right under any concurrency.)
//
// It returns, in batch order, each job's id and whether it was a
// duplicate. An inserted keyed job is found by its key; the inserted jobs
// without a key take ids in batch order (the sequence is drawn in ORDER BY
// order), so the n-th of them in the batch is the n-th smallest id. A
// duplicate's id is read from the statement's snapshot; when the row it
// collided with was committed after that snapshot (the concurrent enqueue
// it waited for), the id is 0 and the caller reads it with
// SQLUniqueLookup, a new statement with a new snapshot.
func SQLUnique(n Notify) string {
	return `
WITH b AS (
    SELECT *, CASE WHEN b.unique_key IS NULL
                   THEN row_number() OVER (PARTITION BY b.unique_key IS NULL ORDER BY b.ord) END AS keyless_n
    FROM ROWS FROM (jsonb_to_recordset($1::jsonb) AS (
             kind text, queue text, args jsonb, priority smallint, max_attempts integer,
             run_at timestamptz, delay_us bigint, metadata jsonb, ordering_key text, tags text[], unique_key text, unique_states text[]))
         WITH ORDINALITY AS b(kind, queue, args, priority, max_attempts, run_at, delay_us, metadata, ordering_key, tags, unique_key, unique_states, ord)
),
ins AS (
INSERT INTO relay_jobs (kind, queue, args, priority, max_attempts, run_at, metadata, ordering_key, tags, unique_key, unique_states)
SELECT j.kind, j.queue, j.args, j.priority, j.max_attempts,
       coalesce(j.run_at, now() + j.delay_us * interval '1 microsecond'),
       j.metadata, j.ordering_key, coalesce(j.tags, '{}'), j.unique_key, j.unique_states
FROM b AS j` + notifyJoin(n) + `
ORDER BY j.ord
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state = ANY (unique_states)
DO NOTHING
RETURNING id, unique_key
),
keyless AS (
    SELECT id, row_number() OVER (ORDER BY id) AS n FROM ins WHERE unique_key IS NULL
)
SELECT coalesce(i.id, k.id, e.id, 0), i.id IS NULL AND k.id IS NULL
FROM b
LEFT JOIN ins AS i ON i.unique_key = b.unique_key
LEFT JOIN keyless AS k ON k.n = b.keyless_n
LEFT JOIN LATERAL (
    SELECT r.id FROM relay_jobs AS r
    WHERE r.unique_key = b.unique_key AND r.state = ANY (r.unique_states)
    LIMIT 1) AS e ON i.id IS NULL
ORDER BY b.ord`
}

// SQLUniqueLookup reads the ids of the jobs holding the unique keys of the
// JSON array $1 (see SQLUnique).
const SQLUniqueLookup = `
SELECT unique_key, id FROM relay_jobs
WHERE unique_key IN (SELECT jsonb_array_elements_text($1::jsonb)) AND state = ANY (unique_states)`

// SQLNotifyQueues wakes the workers of the queues in the JSON array $1, in
// a transaction of its own. PostgreSQL gives it a transaction id (written
// into the notification queue), so its commit writes a commit record; but
// having written nothing else, it does not wait for that record's flush
// (RecordTransactionCommit): no fsync per wake-up.
const SQLNotifyQueues = `SELECT pg_notify('relay_jobs', q) FROM jsonb_array_elements_text($1::jsonb) AS q`
