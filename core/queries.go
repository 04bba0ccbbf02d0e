package core

import (
	"math/bits"
	"strconv"
	"strings"

	"github.com/relayq/relay/internal/jobinsert"
)

// All of the core's SQL, in one place (the enqueue statements are the
// engine's, in internal/jobinsert). Every UPDATE of state names the state
// it moves from in its WHERE clause, so it can only make a transition of the
// state machine (and the table's trigger refuses any other). Every write about
// a running attempt names the attempt's lease token: that is the fence that
// keeps a late worker from recording anything once its lease has gone.
//
// A statement with variants (the claim with and without its cursor, with
// an asynchronous or the session's commit; the fenced batch writes, which
// share one shape) is written once, as a function of its named parts, and
// each variant is that function's text for its parts. Written-out copies
// drift (a fix made to one and not the others), and a text replacement
// can silently match nothing or the wrong place once the base statement
// changes; the parts a builder takes are what differs, named, and the rest
// is one text. Statements without variants stay constants.

// The enqueue statements are the engine's (internal/jobinsert), which the
// workflow layer's start of a run shares: sqlEnqueue for a batch without
// unique jobs, sqlEnqueueUnique for one with, each also for an enqueue
// that is its own transaction and wakes its queues after the commit.
var (
	sqlEnqueue                  = jobinsert.SQL(jobinsert.NotifyAtCommit)
	sqlEnqueueNotifyAfter       = jobinsert.SQL(jobinsert.NotifyAfter)
	sqlEnqueueUnique            = jobinsert.SQLUnique(jobinsert.NotifyAtCommit)
	sqlEnqueueUniqueNotifyAfter = jobinsert.SQLUnique(jobinsert.NotifyAfter)
)

// sqlUniqueLookup reads the ids of the jobs holding the unique keys of the
// JSON array $1 (see jobinsert.SQLUnique).
const sqlUniqueLookup = jobinsert.SQLUniqueLookup

// sqlNotifyQueues wakes the workers of the queues in the JSON array $1 (see
// jobinsert.SQLNotifyQueues).
const sqlNotifyQueues = jobinsert.SQLNotifyQueues

// sqlClaim leases up to $2 runnable jobs of queue $1 to worker $4 for $3
// milliseconds, in one statement:
//
//   - It walks relay_jobs_claim_idx (queue, key_waiting, priority, run_at,
//     id) over queued rows only, so finished rows cost nothing, and stops at
//     $2 rows. Because priority comes before run_at there, run_at <= now()
//     alone cannot end a walk: with fewer jobs due than asked for, it read
//     on through every scheduled (not yet due) job of the queue. So prios
//     takes the queue's priorities one index probe each (a loose index
//     scan, in order, only as far as the claim needs), and for each the
//     claim walks (queue, false, priority) from its front to run_at =
//     now(): due jobs only, whatever is scheduled behind them
//     (TestClaimBesideScheduledJobs). The nested loop over prios, in
//     ascending priority, each in (run_at, id) order, keeps the claim
//     order without a sort, and the outer LIMIT stops it (and its row
//     locks) at $2 rows.
//   - The UPDATE finds the picked rows by a primary-key probe each, as
//     long as the plan thinks picked holds about one row. A prepared claim
//     keeps the plan made for the table as it was when it was prepared
//     (until an ANALYZE), and the generic plan counts a LIMIT $2 as 10% of
//     its input: over the 101 rows PostgreSQL supposes of any recursive
//     CTE, picked would be 10 rows, and against a young, small table a
//     hash join over a sequential scan is the cheaper plan for 10. Kept
//     while the table grew, every claim then read the whole table.
//     prios's LIMIT $2 + 65536 is never reached (a smallint has 65,536
//     values, and $2 >= 1); it makes the estimate of the priorities 10%
//     of 101, and so picked's one row, as in walkClaimStatement
//     (TestPreparedClaimProbesThePrimaryKey).
//   - Only the head of each ordering key is in the range it reads (queue,
//     false, ...): a job waiting for an earlier job of its key carries
//     key_waiting, kept by the triggers of migration *_ordering_heads, so a
//     claim never walks a busy key's backlog (TestClaimSkipsKeyBacklog). A
//     head is still checked to be its key's first unfinished job (the first
//     entry of relay_jobs_ordering_idx for its key: min(id) keeps the plan
//     on the index whatever the statistics say of a hot key), so order
//     never rests on the triggers; a job without a key pays only the IS
//     NULL test.
//   - A paused queue (a row in relay_queue_pauses, see core/pause.go)
//     yields nothing: one primary-key probe, evaluated once per statement.
//   - FOR UPDATE SKIP LOCKED locks the rows it picks and steps over rows
//     another worker's claim has locked: claimers never wait on each other,
//     and no row is picked twice.
//   - The UPDATE moves them to claimed, counts the attempt now (so a job that
//     kills its worker still burns attempts), and installs a lease token and
//     an expiry computed from the database's clock. The token ($5) is fresh
//     for each claim statement and shared by the jobs it claims: fencing
//     matches (id, token), so a token only has to be new for each claim of a
//     job, and one random UUID per batch saves gen_random_uuid per row.
//   - Its commit is asynchronous (synchronous_commit off for this transaction
//     only): it does not wait for the WAL flush. Losing it is safe. Only a
//     PostgreSQL crash in the next few hundred milliseconds can lose it, and
//     then the job is simply queued again, as if never claimed; whatever the
//     worker records under the lost lease is refused by the fence, and any
//     later synchronous commit (a CompleteTx, a success) flushes the claim
//     with it, since WAL is flushed in order. A job or an effect is never
//     lost; at worst an attempt runs again, which at-least-once allows. The
//     claim is on every job's critical path, so its fsync was the largest
//     single cost of a slot-bound worker (see docs/benchmarks.md).
//
// sqlClaimSync and sqlClaimAfterSync commit synchronously
// (Config.SynchronousClaims); sqlClaimAfter and sqlClaimAfterSync claim
// from a drain's cursor, in one walk of its priority's due range (see
// walkClaimStatement); sqlClaimFrom and sqlClaimFromSync from the claim
// floor (claimfloor.go), over every priority after it (claimStatement).
var (
	sqlClaim          = claimStatement(false, asyncCommit)
	sqlClaimSync      = claimStatement(false, sessionCommit)
	sqlClaimAfter     = walkClaimStatement(asyncCommit, 0)
	sqlClaimAfterSync = walkClaimStatement(sessionCommit, 0)
	sqlClaimFrom      = claimStatement(true, asyncCommit)
	sqlClaimFromSync  = claimStatement(true, sessionCommit)
)

// walkClaimStatement is the claim from the cursor of a drain ($6
// priority, $7 run_at, $8 id: the last job of the previous claim, which
// took all it asked for) as one walk of the claim index over the rest of
// the cursor's priority's due range, and no further: its end is
// (priority $6, now()), so it never reaches the scheduled jobs behind the
// due ones nor the priorities after it. It costs PostgreSQL less per claim
// than claimStatement's walk over priorities (docs/benchmarks.md, "Cost as
// the work grows"). A claim that finds fewer jobs than it asks for ends the
// drain: the fetch loop drops the cursor, and its next claim, from the
// front, walks the priorities. The walk used to go on past the cursor's
// priority: whenever a backlog ran out it stepped over every scheduled job
// of that priority (beside 1M scheduled jobs, ~1,400 buffers and ~49 ms a
// claim, and a steady load fell behind: TestClaimBesideScheduledJobs).
//
// bound, when not 0, is a literal bound on $2 (a claim of at most bound
// jobs), which lets PostgreSQL keep one plan for the prepared statement.
// The generic plan counts a LIMIT $2 as 10% of its input, so over a large
// table it looked dearer than each call's own plan for its $2, and the
// statement was planned again on every call (a third of its time in a
// drain: docs/benchmarks.md, "The drain cursor's claim, planned once").
// Under a literal LIMIT bound, the estimate is a tenth of bound, below
// what any claim of more than bound/2 jobs asks for: the generic plan is
// chosen after the first five calls and kept (the walk of the claim index
// and a primary-key probe per picked row, TestWalkClaimKeepsOnePlan). The
// outer LIMIT $2 stops the walk, and its row locks, at $2 rows.
func walkClaimStatement(commit string, bound int) string {
	walk := `SELECT id
    FROM relay_jobs AS c
    WHERE state = 'queued' AND NOT key_waiting AND queue = $1 AND priority = $6::smallint
      AND run_at <= now() AND (run_at, id) > ($7::timestamptz, $8::bigint)
      AND NOT EXISTS (SELECT 1 FROM relay_queue_pauses WHERE queue = $1)
      AND (ordering_key IS NULL OR c.id = (
          SELECT min(e.id) FROM relay_jobs AS e
          WHERE e.queue = c.queue AND e.ordering_key = c.ordering_key
            AND e.state IN ('queued', 'claimed', 'dead')))
    ORDER BY run_at, id`
	if bound == 0 {
		walk += `
    LIMIT $2
    FOR UPDATE SKIP LOCKED`
	} else {
		walk = `SELECT id FROM (
    ` + walk + `
    LIMIT ` + strconv.Itoa(bound) + `
    FOR UPDATE SKIP LOCKED) AS c
    LIMIT $2`
	}
	return `
WITH picked AS (
    ` + walk + `
)
` + claimUpdate(4, 5, 3, `FROM picked, `+commit+`
WHERE j.id = picked.id`)
}

// walkClaimBounds are the bounds of the drain cursor's claims planned once
// (walkClaimStatement): powers of two up to 1,024. A larger claim uses
// sqlClaimAfter, planned on each call.
const walkClaimBounds = 11

// sqlClaimAfterBounded and sqlClaimAfterSyncBounded hold sqlClaimAfter and
// sqlClaimAfterSync bounded by 1 << i at i.
var sqlClaimAfterBounded, sqlClaimAfterSyncBounded = func() (a, s [walkClaimBounds]string) {
	for i := range walkClaimBounds {
		a[i], s[i] = walkClaimStatement(asyncCommit, 1<<i), walkClaimStatement(sessionCommit, 1<<i)
	}
	return a, s
}()

// walkClaimSQL is the drain cursor's claim of limit jobs: the statement of
// the smallest bound that holds limit, or the unbounded one.
func walkClaimSQL(sync bool, limit int) string {
	i := bits.Len(uint(max(limit, 1) - 1)) // 1 << i >= limit
	switch {
	case i >= walkClaimBounds && sync:
		return sqlClaimAfterSync
	case i >= walkClaimBounds:
		return sqlClaimAfter
	case sync:
		return sqlClaimAfterSyncBounded[i]
	default:
		return sqlClaimAfterBounded[i]
	}
}

// claimStatement is the claim statement: from the cursor (after: sqlClaimAfter)
// or the front of the queue, committing as commit says. The commit mode is
// the first CTE so that it stays within pg_stat_activity's first 1,024
// characters of the statement, where operators (and
// TestSynchronousClaimsWaitForTheStandby) look for it.
//
// sqlClaimFrom starts after the position ($6 priority, $7 run_at, $8 id)
// in claim order: the claim floor, before which the queue has no queued
// job (claimfloor.go), and walks every priority from there. Every claimed
// job leaves a dead entry at the front of the claim index until VACUUM,
// so a claim from the start steps over all the jobs claimed since; one
// from the floor or a drain's cursor (sqlClaimAfter, walkClaimStatement)
// starts where they end. Jobs that become runnable behind the cursor (a more
// urgent new job, a rescued one) are reached when the fetch loop drops the
// cursor: on every notification and every poll.
func claimStatement(after bool, commit string) string {
	cursor, first := "", ""
	if after {
		// Each priority's walk starts at the floor's position within it
		// ((run_at, id) after the equality on priority, a start key of the
		// index scan). Spelled (priority, run_at, id) > (...), the row
		// comparison beside priority = prios.priority was no start key:
		// the walk began at the priority's front and stepped over the dead
		// entries the floor is there to skip (142 buffers against 22 in
		// TestClaimFloorKeeper's scene).
		cursor = `
          AND (run_at, id) > (CASE WHEN prios.priority = $6::smallint THEN $7::timestamptz
                                   WHEN prios.priority < $6::smallint THEN 'infinity' ELSE '-infinity' END,
                              CASE WHEN prios.priority = $6::smallint THEN $8::bigint ELSE 0 END)`
		first = "\n       AND (priority, run_at, id) > ($6::smallint, $7::timestamptz, $8::bigint)"
	}
	return `
WITH RECURSIVE commit_mode AS (SELECT * FROM ` + commit + `),
prios AS (
    (SELECT priority FROM relay_jobs AS p
     WHERE state = 'queued' AND NOT key_waiting AND queue = $1` + first + `
     ORDER BY priority, run_at, id
     LIMIT 1)
    UNION ALL
    SELECT (SELECT p.priority FROM relay_jobs AS p
            WHERE p.state = 'queued' AND NOT p.key_waiting AND p.queue = $1 AND p.priority > prios.priority
            ORDER BY p.priority
            LIMIT 1)
    FROM prios
    WHERE prios.priority IS NOT NULL
),
picked AS (
    SELECT c.id
    FROM (SELECT priority FROM prios LIMIT $2 + 65536) AS prios CROSS JOIN LATERAL (
        SELECT id
        FROM relay_jobs AS c
        WHERE state = 'queued' AND NOT key_waiting AND queue = $1 AND priority = prios.priority AND run_at <= now()` + cursor + `
          AND NOT EXISTS (SELECT 1 FROM relay_queue_pauses WHERE queue = $1)
          AND (ordering_key IS NULL OR c.id = (
              SELECT min(e.id) FROM relay_jobs AS e
              WHERE e.queue = c.queue AND e.ordering_key = c.ordering_key
                AND e.state IN ('queued', 'claimed', 'dead')))
        ORDER BY run_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED) AS c
    LIMIT $2
)
` + claimUpdate(4, 5, 3, `FROM picked, commit_mode
WHERE j.id = picked.id`)
}

// claimUpdate is the UPDATE every claim statement ends with: it claims
// the rows rows (its FROM and WHERE clauses) select for worker $by, with
// lease token $token for $ms milliseconds (the numbers of the statement's
// parameters), counting the attempt, and returns claimReturning. The claim
// statements share this one text, so that none can set another lease or
// return other columns than claimDecoder reads.
func claimUpdate(by, token, ms int, rows string) string {
	return `UPDATE relay_jobs AS j
SET state            = 'claimed',
    attempt          = j.attempt + 1,
    attempted_at     = now(),
    attempted_by     = $` + strconv.Itoa(by) + `,
    lease_token      = $` + strconv.Itoa(token) + `::uuid,
    lease_expires_at = now() + $` + strconv.Itoa(ms) + ` * interval '1 millisecond'
` + rows + `
` + claimReturning
}

// claimReturning is the claim statements' RETURNING list: claimedColumns'
// expressions, in their order, seven to a line.
var claimReturning = func() string {
	var b strings.Builder
	b.WriteString("RETURNING ")
	for i, col := range claimedColumns {
		switch {
		case i == 0:
		case i%7 == 0:
			b.WriteString(",\n          ")
		default:
			b.WriteString(", ")
		}
		b.WriteString(col.expr)
	}
	return b.String()
}()

// asyncCommit, in a claim statement, makes its transaction commit
// asynchronously; sessionCommit, in the synchronous twins of those
// statements (Config.SynchronousClaims), leaves the session's
// synchronous_commit as it is, at the same place in the statement.
const (
	asyncCommit   = `(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit`
	sessionCommit = `(SELECT set_config('synchronous_commit', current_setting('synchronous_commit'), true)) AS session_commit`
)

// The fenced writes about running attempts (sqlCompleteMany, sqlFailMany,
// sqlReleaseMany, sqlHeartbeat) share one shape, because they must never
// wait on a row lock another transaction holds — a caller's long
// transaction that cancels a running job, say: one locked row would stall
// the whole batch, and a stalled heartbeat lets every other lease expire.
//
//   - locked: the batch's rows whose lease token still matches, locked with
//     FOR NO KEY UPDATE SKIP LOCKED (the mode the UPDATE itself takes, so
//     nothing is upgraded). Rows locked elsewhere are stepped over.
//   - done: the UPDATE of exactly those rows. Their ids reach it as an
//     array (ARRAY(SELECT ...)), so its plan is a primary-key probe per id.
//   - The result: each written id with true, then each id whose token still
//     matches in the statement's snapshot but was not written (locked
//     elsewhere) with false. An id missing from both has lost its lease.
//     That second look is skipped (a one-time filter) when every id was
//     written, the common case, so it costs nothing then.
//
// Batches ($1 ids, $2 their tokens) are matched as pairs. A claim statement
// gives all its jobs one token, so matching ids and tokens as two sets would
// let a late attempt's outcome land on a newer attempt of the same job
// claimed by this client in a batch whose token is also in the set
// (TestFenceMatchesPairs). The id set drives the plan (a primary-key probe
// per id) and the pairs are a hashed semi-join on the few rows found.
//
// These statements name no state: a lease token is present exactly while a
// job is claimed (a rule of relay_jobs_broken_rule, held by the triggers), so
// matching the token is matching a claimed attempt. Naming the state would
// let the planner walk the partial lease index over every claimed row when
// its statistics say few are claimed (right after a bulk insert and
// ANALYZE, when workers then claim thousands); without it the plan is a
// primary-key probe per id. TestFencedWritesProbeThePrimaryKey keeps it so.

// fencedWrite is the one text of the fenced batch writes: inputs, a CTE
// ahead of locked ("" for none); pairs, the relation of the batch's (id,
// token) pairs; set, the UPDATE's SET list over relay_jobs AS j; from and
// join, a relation the UPDATE reads and its join condition ("" for none).
func fencedWrite(inputs, pairs, set, from, join string) string {
	with := "WITH "
	if inputs != "" {
		with += inputs + ", "
	}
	if from != "" {
		from = "\n    FROM " + from
		join = " AND " + join
	}
	return `
` + with + `locked AS (
    SELECT id FROM relay_jobs
    WHERE id = ANY($1::bigint[])
      AND (id, lease_token) IN (` + pairs + `)
    FOR NO KEY UPDATE SKIP LOCKED
), done AS (
    UPDATE relay_jobs AS j
    SET ` + set + from + `
    WHERE j.id = ANY(ARRAY(SELECT id FROM locked))` + join + `
    RETURNING j.id
)
SELECT id, true FROM done
UNION ALL
SELECT id, false FROM relay_jobs
WHERE id = ANY($1::bigint[])
  AND (id, lease_token) IN (` + pairs + `)
  AND id NOT IN (SELECT id FROM done)
  AND (SELECT count(*) FROM done) < cardinality($1::bigint[])`
}

// batchPairs is the (id, token) pairs of a batch given as $1 ids and $2
// their tokens.
const batchPairs = `SELECT * FROM unnest($1::bigint[], $2::uuid[])`

// sqlCompleteMany records the success of a batch of attempts.
var sqlCompleteMany = fencedWrite("", batchPairs,
	`state = 'succeeded', finalized_at = now(), lease_token = NULL, lease_expires_at = NULL`, "", "")

// sqlCompleteOne is sqlCompleteMany for one attempt, in a caller's
// transaction on any driver (the token travels as text). It is the
// caller's own write, in the caller's transaction: it may wait.
const sqlCompleteOne = `
UPDATE relay_jobs
SET state = 'succeeded', finalized_at = now(), lease_token = NULL, lease_expires_at = NULL
WHERE id = $1 AND lease_token = $2::uuid`

// sqlFailMany records a batch of failed attempts ($1 ids, $2 tokens): each
// back to queued after $4 microseconds, or dead ($3 names which), with
// error $5. The delay goes into the attempt's history entry beside the
// error (retry_in_us, null when the job ended dead).
var sqlFailMany = fencedWrite(`f AS (
    SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::bigint[], $5::text[])
        AS f(id, token, state, delay_us, error)
)`, `SELECT id, token FROM f`, `state            = f.state,
        run_at           = CASE WHEN f.state = 'queued' THEN now() + f.delay_us * interval '1 microsecond' ELSE j.run_at END,
        finalized_at     = CASE WHEN f.state = 'dead' THEN now() END,
        lease_token      = NULL,
        lease_expires_at = NULL,
        last_error       = f.error,
        history          = j.history || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempt, 'started_at', j.attempted_at, 'finished_at', now(),
            'error', f.error, 'worker', j.attempted_by,
            'retry_in_us', CASE WHEN f.state = 'queued' THEN f.delay_us END))`,
	"f", "f.id = j.id")

// sqlReleaseMany returns attempts interrupted by a client's shutdown to
// the queue at once. The attempt is not counted: a deploy must not burn
// attempts.
var sqlReleaseMany = fencedWrite("", batchPairs, `state            = 'queued',
        attempt          = j.attempt - 1,
        lease_token      = NULL,
        lease_expires_at = NULL,
        history          = j.history || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempt, 'started_at', j.attempted_at, 'finished_at', now(),
            'error', 'interrupted: worker shut down; attempt not counted', 'worker', j.attempted_by))`, "", "")

// sqlHeartbeat renews the leases of a batch of running attempts by $3
// milliseconds from the database's now(). Renewed ids come with true; ids
// whose rows another transaction holds with false (not renewed this tick:
// the lease still holds, but the local lease deadline runs on); a job
// missing has lost its lease (rescued or cancelled): its handler must stop.
var sqlHeartbeat = fencedWrite("", batchPairs, `lease_expires_at = now() + $3 * interval '1 millisecond'`, "", "")

// sqlRescueExpired locks up to $1 expired leases, oldest first, for rescue
// to give each its retry delay. SKIP LOCKED lets any number of processes
// rescue at once; a lease renewed meanwhile is re-checked under the row lock
// and left alone.
const sqlRescueExpired = `
SELECT id, kind, attempt, coalesce(attempted_by, '?')
FROM relay_jobs
WHERE state = 'claimed' AND lease_expires_at < now()
ORDER BY lease_expires_at
LIMIT $1
FOR UPDATE SKIP LOCKED`

// sqlRescue ends the leases sqlRescueExpired locked (ids $1) in the same
// transaction: back to queued after the job's retry delay ($2, microseconds,
// per id), or dead when the job has used all its attempts (a job that keeps
// killing its workers ends here rather than crash-looping). The lost
// attempt goes into the history like any failed one. It returns the
// workflow run a job executes (metadata relay.run_id), for the rescue's log line.
const sqlRescue = `
UPDATE relay_jobs AS j
SET state            = CASE WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'queued' END,
    finalized_at     = CASE WHEN j.attempt >= j.max_attempts THEN now() END,
    run_at           = CASE WHEN j.attempt >= j.max_attempts THEN j.run_at
                            ELSE now() + r.delay * interval '1 microsecond' END,
    lease_token      = NULL,
    lease_expires_at = NULL,
    last_error       = 'lease expired: worker ' || coalesce(j.attempted_by, '?') || ' stopped renewing it',
    history          = j.history || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt, 'started_at', j.attempted_at, 'finished_at', now(),
        'error', 'lease expired', 'worker', j.attempted_by))
FROM unnest($1::bigint[], $2::bigint[]) AS r(id, delay)
WHERE j.id = r.id
RETURNING j.id, j.kind, j.state, j.run_at, coalesce(j.metadata->>'relay.run_id', '')`

// sqlCleanup deletes up to $3 jobs in final state $1 finalized more than $2
// microseconds ago.
const sqlCleanup = `
DELETE FROM relay_jobs
WHERE id IN (
    SELECT id
    FROM relay_jobs
    WHERE state = $1 AND finalized_at < now() - $2 * interval '1 microsecond'
    ORDER BY finalized_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)`

// sqlCancel cancels job $1 if it is queued or running. A running job's lease
// ends with it, which fences out its worker.
//
// It returns the lease token the job had (” when it was queued): the
// cancel notification names the attempt it cancels, so that a worker
// running a newer attempt of the job (cancelled, requeued and claimed again
// before the notification arrived) ignores it.
const sqlCancel = `
UPDATE relay_jobs AS j
SET state = 'cancelled', finalized_at = now(), lease_token = NULL, lease_expires_at = NULL
FROM (SELECT id, lease_token FROM relay_jobs WHERE id = $1 FOR UPDATE) AS old
WHERE j.id = old.id AND j.state IN ('queued', 'claimed')
RETURNING j.queue, coalesce(j.ordering_key, ''), coalesce(old.lease_token::text, '')`

// sqlCancelledAmong returns which of the jobs $1 are cancelled
// (Client.cancelMissed: cancellations whose notification nobody heard).
const sqlCancelledAmong = `SELECT id FROM relay_jobs WHERE id = ANY($1::bigint[]) AND state = 'cancelled'`

// sqlNotifyCancel tells running workers (of any process) to stop job $1 now
// rather than at their next heartbeat. Delivered at commit.
//
// The payload is cancel:<id>:<lease token> (the token empty for a queued
// job).
const sqlNotifyCancel = `SELECT pg_notify('relay_control', 'cancel:' || $1::text || ':' || $2::text)`

// sqlRequeue puts a dead or cancelled job $1 back in its queue, runnable now,
// with a fresh set of attempts. Its history is kept.
const sqlRequeue = `
UPDATE relay_jobs
SET state = 'queued', attempt = 0, run_at = now(), finalized_at = NULL
WHERE id = $1 AND state IN ('dead', 'cancelled')
RETURNING queue`

// sqlRefixKeys re-fixes up to $1 ordering keys whose commit-time fix could
// not settle them (made under REPEATABLE READ or SERIALIZABLE, or stepping
// over the next job's locked row; migration *_key_refix), in READ
// COMMITTED. It returns the hand-offs taken and the keys handed off again
// (their next row still locked).
const sqlRefixKeys = `SELECT taken, "left" FROM relay_jobs_key_refix($1)`

// sqlRewake makes up to $1 handed-off wake-ups (relay_jobs_wake stepped
// over a held row; migration *_job_rewake): taken, and left still held.
const sqlRewake = `SELECT taken, "left" FROM relay_jobs_rewake($1)`

// sqlNotifyQueue wakes the workers of queue $1.
const sqlNotifyQueue = `SELECT pg_notify('relay_jobs', $1::text)`

// sqlJobState reads one job's state (to explain a refused transition).
const sqlJobState = `SELECT state FROM relay_jobs WHERE id = $1`

// jobColumns is the select list of a JobRow (scanned by scanJobRow).
// Timestamps that no client can decode (infinity, -infinity: written
// behind the API, before the row rules refused them) read as NULL, so that
// the row can still be inspected; the tags travel as JSON, which every
// driver can read.
const jobColumns = `id, kind, queue, state, priority, attempt, max_attempts,
       CASE WHEN isfinite(run_at) THEN run_at END, CASE WHEN isfinite(created_at) THEN created_at END,
       CASE WHEN isfinite(attempted_at) THEN attempted_at END, coalesce(attempted_by, ''),
       CASE WHEN isfinite(finalized_at) THEN finalized_at END, coalesce(last_error, ''),
       args::text, metadata::text, history::text, coalesce(ordering_key, ''), array_to_json(tags)::text`

// sqlGetJob reads one job.
const sqlGetJob = `SELECT ` + jobColumns + `
FROM relay_jobs
WHERE id = $1`

// sqlListJobs lists up to $7 jobs, newest first, below id $6 (0: from the
// newest), filtered by queue $1 (” for any), kinds $2, states $3 (JSON
// arrays, empty for any) and tags $4 (JSON array; a job must carry them
// all). Arrays travel as JSON text so that every driver can send them.
// The tag filter says tags <> '{}' as well, so that it can use the
// partial GIN index relay_jobs_tags_idx; $5 says whether it applies.
const sqlListJobs = `SELECT ` + jobColumns + `
FROM relay_jobs
WHERE ($1 = '' OR queue = $1)
  AND ($2::jsonb = '[]' OR kind IN (SELECT jsonb_array_elements_text($2::jsonb)))
  AND ($3::jsonb = '[]' OR state IN (SELECT jsonb_array_elements_text($3::jsonb)))
  AND (NOT $5::boolean OR (tags <> '{}' AND tags @> ARRAY(SELECT jsonb_array_elements_text($4::jsonb))))
  AND ($6::bigint = 0 OR id < $6::bigint)
ORDER BY id DESC
LIMIT $7`

// sqlBlockedKeys lists ordering keys whose first unfinished job is dead:
// nothing after it runs until it is requeued or cancelled. $1 ” means every
// queue.
const sqlBlockedKeys = `
SELECT d.queue, d.ordering_key, d.id,
       (SELECT count(*) FROM relay_jobs AS w
        WHERE w.queue = d.queue AND w.ordering_key = d.ordering_key AND w.id > d.id
          AND w.state IN ('queued', 'claimed', 'dead')) AS waiting
FROM relay_jobs AS d
WHERE d.ordering_key IS NOT NULL AND d.state = 'dead' AND ($1 = '' OR d.queue = $1)
  AND NOT EXISTS (
      SELECT 1 FROM relay_jobs AS e
      WHERE e.queue = d.queue AND e.ordering_key = d.ordering_key AND e.id < d.id
        AND e.state IN ('queued', 'claimed', 'dead'))
ORDER BY d.id
LIMIT $2`

// sqlQueueDepths counts the runnable jobs of each queue and the age of the
// oldest, from the claim index alone.
const sqlQueueDepths = `
SELECT queue, count(*), coalesce(extract(epoch FROM now() - min(run_at)), 0)::float8
FROM relay_jobs WHERE state = 'queued' AND run_at <= now()
GROUP BY queue`

// sqlDrawIDs draws $1 job ids, in order, for a COPY batch.
const sqlDrawIDs = `SELECT nextval(pg_get_serial_sequence('relay_jobs', 'id')) FROM generate_series(1, $1)`

// sqlNotifyAfterCommit tells the insert trigger, for this transaction,
// that the wake-up is sent after the commit.
const sqlNotifyAfterCommit = `SELECT set_config('relay.notify', 'after', true)`

// sqlLimitsApply says whether a global limit may apply to a claim of queue
// $1: one on the queue, or one on any kind or tag.
const sqlLimitsApply = `SELECT EXISTS (SELECT 1 FROM relay_limits WHERE (scope = 'queue' AND name = $1) OR scope IN ('kind', 'tag'))`

// sqlLockLimits locks the limits that apply to a claim of queue $1, in a
// fixed order (no deadlocks between claimers), and reads them with the
// transaction's now(). Held until the claim commits: claims of limited
// work serialise here, so each counts what the previous one claimed. The
// transaction commits asynchronously, as sqlClaim does, for the same
// reasons.
//
// sqlLockLimitsSync leaves the claim's transaction to commit synchronously
// (Config.SynchronousClaims).
var (
	sqlLockLimits     = lockLimitsStatement(asyncCommit)
	sqlLockLimitsSync = lockLimitsStatement(sessionCommit)
)

func lockLimitsStatement(commit string) string {
	return `
SELECT scope, name, max_running, rate, per_us, window_start, window_count, now()
FROM relay_limits, ` + commit + `
WHERE (scope = 'queue' AND name = $1) OR scope IN ('kind', 'tag')
ORDER BY scope, name
FOR UPDATE OF relay_limits`
}

// sqlCountRunning counts claimed jobs by kind, split by whether they are
// of queue $1, among those of queue $1 or of a kind in $2. It walks
// relay_jobs_lease_idx: the running jobs, a number bounded by the workers.
const sqlCountRunning = `
SELECT kind, queue = $1, count(*)
FROM relay_jobs
WHERE state = 'claimed' AND (queue = $1 OR kind = ANY($2::text[]))
GROUP BY 1, 2`

// sqlCountRunningTagged counts claimed jobs carrying each tag of $1.
const sqlCountRunningTagged = `
SELECT t.tag, count(*)
FROM relay_jobs AS j, unnest($1::text[]) AS t(tag)
WHERE j.state = 'claimed' AND j.tags <> '{}' AND t.tag = ANY(j.tags)
GROUP BY 1`

// sqlClaimLimited is sqlClaim under global limits (see sqlLockLimits; it
// runs in the same transaction). It claims up to $2 jobs of queue $1 —
// $2 already bounded by the queue's limits — skipping kinds in $6 and
// jobs carrying a tag in $10 (at their limit), and taking at most $8[i]
// jobs of kind $7[i] and at most $12[i] jobs carrying tag $11[i].
// Candidates are locked first, up to $9 of them (more than $2, so that a
// capped kind at the head of the queue does not hide the others), and
// then ranked per kind and per capped tag: FOR UPDATE cannot share a query
// level with a window function. A job with several capped tags is ranked
// under each independently, which can only claim fewer, never more.
// Candidates not claimed stay locked until the commit, which other
// claimers skip.
var sqlClaimLimited = `
WITH candidates AS (
    SELECT id, kind, priority, run_at, tags
    FROM relay_jobs AS c
    WHERE state = 'queued' AND NOT key_waiting AND queue = $1 AND run_at <= now()
      AND NOT EXISTS (SELECT 1 FROM relay_queue_pauses WHERE queue = $1)
      AND NOT (kind = ANY($6::text[])) AND NOT (tags && $10::text[])
      AND (ordering_key IS NULL OR c.id = (
          SELECT min(e.id) FROM relay_jobs AS e
          WHERE e.queue = c.queue AND e.ordering_key = c.ordering_key
            AND e.state IN ('queued', 'claimed', 'dead')))
    ORDER BY priority, run_at, id
    LIMIT $9
    FOR UPDATE SKIP LOCKED
), ranked AS (
    SELECT id, kind, priority, run_at,
           row_number() OVER (PARTITION BY kind ORDER BY priority, run_at, id) AS nth
    FROM candidates
), over_tag_cap AS (
    SELECT id
    FROM (SELECT c.id, cap.n,
                 row_number() OVER (PARTITION BY cap.tag ORDER BY c.priority, c.run_at, c.id) AS nth
          FROM candidates AS c
          JOIN unnest($11::text[], $12::integer[]) AS cap(tag, n) ON cap.tag = ANY(c.tags)) AS t
    WHERE t.nth > t.n
), picked AS (
    SELECT r.id
    FROM ranked AS r
    LEFT JOIN unnest($7::text[], $8::integer[]) AS cap(kind, n) ON cap.kind = r.kind
    WHERE (cap.n IS NULL OR r.nth <= cap.n)
      AND r.id NOT IN (SELECT id FROM over_tag_cap)
    ORDER BY r.priority, r.run_at, r.id
    LIMIT $2
)
` + claimUpdate(4, 5, 3, `FROM picked
WHERE j.id = picked.id`)

// sqlAdvanceWindow records claims against a rate limit: window start $3,
// claims in it $4.
const sqlAdvanceWindow = `
UPDATE relay_limits SET window_start = $3, window_count = $4
WHERE scope = $1 AND name = $2`

// sqlSetLimit creates or replaces a limit; its rate window starts over.
const sqlSetLimit = `
INSERT INTO relay_limits (scope, name, max_running, rate, per_us)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (scope, name) DO UPDATE
SET max_running = excluded.max_running, rate = excluded.rate, per_us = excluded.per_us,
    window_start = now(), window_count = 0, updated_at = now()`

// sqlDeleteLimit removes a limit.
const sqlDeleteLimit = `DELETE FROM relay_limits WHERE scope = $1 AND name = $2`

// sqlListLimits reads every limit.
const sqlListLimits = `SELECT scope, name, max_running, rate, per_us FROM relay_limits ORDER BY scope, name`

// sqlClaimKnown claims job $6, already queued, for worker $1 with lease
// token $2 for $3 milliseconds (an eager caller claiming the job it waits
// for, eagerInserter.Claim): the claim of sqlClaim for one known job, as
// if the client's fetch loop had claimed it, of kind $4 on queue $5. It
// claims nothing, leaving the job queued, when the queue is paused or a
// global limit names the job's queue, kind or one of its tags (an eager
// caller never bypasses them: the limits are counted by claimLimited's
// serialised claims, which this statement cannot join), and claims only a
// runnable job never attempted, without an ordering key (whose order the
// fetch loop's claims keep). jobinsert.SQLIntoClaimed refuses the same.
var sqlClaimKnown = "\n" + claimUpdate(1, 2, 3, `WHERE j.id = $6 AND j.state = 'queued' AND j.run_at <= now()
  AND j.kind = $4 AND j.queue = $5 AND j.attempt = 0 AND j.ordering_key IS NULL
  AND NOT EXISTS (SELECT 1 FROM relay_queue_pauses AS p WHERE p.queue = j.queue)
  AND NOT EXISTS (SELECT 1 FROM relay_limits AS l
                  WHERE (l.scope = 'queue' AND l.name = j.queue) OR (l.scope = 'kind' AND l.name = j.kind)
                     OR (l.scope = 'tag' AND l.name = ANY (j.tags)))`)

// The claim floor (core/claimfloor.go, issue 17 item 3). These statements
// only read; the claims they bound are sqlClaimAfter's.

// sqlFloorProbe returns the database's now() and the first job of queue
// $1 in claim order that its snapshot sees queued (NULLs when none):
// runnable or not, locked by a claim in flight or not, claimable or
// waiting behind its ordering key's head (key_waiting). Every queued job
// sorts at or after it. The claim index keeps a key's waiting jobs in a
// range of their own, so the first of each range is read (one LIMIT 1 walk
// each) and the lesser taken: a waiting job keeps its run_at when it
// becomes its key's head, and a floor past it would hide it.
var sqlFloorProbe = floorProbeStatement(false)

// sqlFloorProbeAfter is sqlFloorProbe starting after the floor ($2
// priority, $3 run_at, $4 id): it reads only what the claims read, and the
// waiting range after the same point.
var sqlFloorProbeAfter = floorProbeStatement(true)

func floorProbeStatement(after bool) string {
	cursor := ""
	if after {
		cursor = "\n           AND (priority, run_at, id) > ($2::smallint, $3::timestamptz, $4::bigint)"
	}
	return `
SELECT now(), j.priority, j.run_at, j.id
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT * FROM (
        (SELECT priority, run_at, id FROM relay_jobs
         WHERE state = 'queued' AND NOT key_waiting AND queue = $1` + cursor + `
         ORDER BY priority, run_at, id
         LIMIT 1)
        UNION ALL
        (SELECT priority, run_at, id FROM relay_jobs
         WHERE state = 'queued' AND key_waiting AND queue = $1` + cursor + `
         ORDER BY priority, run_at, id
         LIMIT 1)) AS firsts
    ORDER BY priority, run_at, id
    LIMIT 1) AS j ON true`
}

// sqlFloorCost is sqlFloorProbe under EXPLAIN: the buffers its walk from
// the front of the claim index touches, which grow with the dead entries
// there (and not with the machine's load, as a time would).
var sqlFloorCost = "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON)" + sqlFloorProbe
