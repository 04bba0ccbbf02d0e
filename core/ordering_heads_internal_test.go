package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/testkit/testdb"
)

type keyedArgs struct {
	N int `json:"n"`
}

func (keyedArgs) Kind() string { return "keyed" }

// enqueueKeyed enqueues one job with ordering key key on db.
func enqueueKeyed(t *testing.T, db DB, key string) int64 {
	t.Helper()
	res, err := Enqueue(context.Background(), db, keyedArgs{}, &EnqueueOpts{OrderingKey: key})
	if err != nil {
		t.Fatal(err)
	}
	return res.ID
}

// claimSQL claims up to n jobs of the default queue, as a worker does.
func claimSQL(t *testing.T, pool *pgxpool.Pool, n int) []*JobRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), sqlClaim, DefaultQueue, n, 60000, "test", [16]byte(uuid.New()))
	if err != nil {
		t.Fatal(err)
	}
	out, err := scanClaimed(rows, "test")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// completeSQL records the success of claimed rows, as the completer does.
func completeSQL(t *testing.T, pool *pgxpool.Pool, rows ...*JobRow) {
	t.Helper()
	ids, tokens := idsAndTokens(rows)
	if _, err := pool.Exec(context.Background(), sqlCompleteMany, ids, tokens); err != nil {
		t.Fatal(err)
	}
}

func claimedIDs(rows []*JobRow) []int64 {
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	return ids
}

// headsOK fails the test unless, for every ordering key, the first
// unfinished job does not wait and every later queued job does.
func headsOK(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var bad []string
	rows, err := pool.Query(context.Background(), `
		SELECT id, ordering_key, state, key_waiting,
		       row_number() OVER (PARTITION BY queue, ordering_key ORDER BY id) AS nth
		FROM relay_jobs
		WHERE ordering_key IS NOT NULL AND state IN ('queued', 'claimed', 'dead')
		ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, nth int64
		var key, state string
		var waiting bool
		if err := rows.Scan(&id, &key, &state, &waiting, &nth); err != nil {
			t.Fatal(err)
		}
		if (nth == 1 && waiting) || (nth > 1 && state == "queued" && !waiting) {
			bad = append(bad, fmt.Sprintf("job %d (key %s, %s, #%d of its key) key_waiting=%v", id, key, state, nth, waiting))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Fatalf("ordering heads broken:\n%s", strings.Join(bad, "\n"))
	}
}

// The claim does not walk a busy key's backlog: beside one key with a
// running head and 10,000 jobs queued behind it (ahead in claim order), a
// claim of 10 unordered jobs reads 10 entries of the claim index.
func TestClaimSkipsKeyBacklog(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if err := fillKeyBacklog(ctx, pool, 10_000); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind) SELECT 'new' FROM generate_series(1, 20)`); err != nil {
		t.Fatal(err)
	}
	var waiting int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_jobs WHERE key_waiting`).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	if waiting != 9_999 {
		t.Fatalf("%d jobs wait behind the key's head, want 9999", waiting)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE relay_jobs`); err != nil {
		t.Fatal(err)
	}
	claimPlansOK(t, pool, 0)
	// The key's head finishes: the next job is the head, first in claim
	// order, and the claim checks it with one probe of the ordering index.
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'cancelled', finalized_at = now(), lease_token = NULL, lease_expires_at = NULL WHERE state = 'claimed'`); err != nil {
		t.Fatal(err)
	}
	headsOK(t, pool)
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE relay_jobs`); err != nil {
		t.Fatal(err)
	}
	claimPlansOK(t, pool, 1)
	if !strings.Contains(sqlClaimAfter, "$6") {
		t.Fatal("sqlClaimAfter lost its cursor (strings.Replace matched nothing)")
	}
}

// claimPlansOK fails the test unless sqlClaim and sqlClaimAfter, claiming
// 10 jobs, read 10 entries of the claim index, filter none out, scan no
// table, and probe the ordering index probes times.
func claimPlansOK(t *testing.T, pool *pgxpool.Pool, probes int) {
	t.Helper()
	for name, sql := range map[string]string{"sqlClaim": sqlClaim, "sqlClaimAfter": sqlClaimAfter} {
		args := []any{DefaultQueue, 10, 30000, "explain", [16]byte(uuid.New())}
		if sql == sqlClaimAfter {
			args = append(args, int16(0), time.Now().Add(-2*time.Hour), int64(0))
		}
		text := explain(t, pool, sql, args...)
		if !strings.Contains(text, "relay_jobs_claim_idx") || strings.Contains(text, "Seq Scan") {
			t.Fatalf("%s does not walk the claim index:\n%s", name, text)
		}
		for _, l := range strings.Split(text, "\n") {
			if strings.Contains(l, "relay_jobs_claim_idx on relay_jobs c") && !strings.Contains(l, "rows=10 ") {
				t.Fatalf("%s: the claim index scan read more than the 10 jobs claimed: %s\n%s", name, l, text)
			}
			if strings.Contains(l, "relay_jobs_claim_idx on relay_jobs p") && !strings.Contains(l, "rows=1 ") && !strings.Contains(l, "rows=0 ") {
				t.Fatalf("%s: a probe for the queue's priorities read more than one entry: %s\n%s", name, l, text)
			}
			if strings.Contains(l, "Rows Removed by Filter") && !strings.Contains(l, "Rows Removed by Filter: 0") {
				t.Fatalf("%s filtered rows out (walked the backlog): %s\n%s", name, l, text)
			}
			if strings.Contains(l, "relay_jobs_ordering_idx") {
				want := "never executed"
				if probes > 0 {
					want = fmt.Sprintf("loops=%d)", probes)
				}
				if !strings.Contains(l, want) {
					t.Fatalf("%s: want the ordering index probed %d times: %s\n%s", name, probes, l, text)
				}
			}
		}
	}
}

// A head finishing while its successor's insert is still uncommitted in a
// caller's open transaction does not wait for that transaction, and the
// successor is claimable once it commits.
func TestKeyHeadFinishesBesideUncommittedSuccessor(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	a := enqueueKeyed(t, pool, "k")
	head := claimSQL(t, pool, 10)
	if len(head) != 1 || head[0].ID != a {
		t.Fatalf("claimed %v, want [%d]", claimedIDs(head), a)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	b := enqueueKeyed(t, tx, "k")

	done := make(chan error, 1)
	go func() {
		ids, tokens := idsAndTokens(head)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := pool.Exec(cctx, sqlCompleteMany, ids, tokens)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("completing the head: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("completing the head waited for the caller's open transaction")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	headsOK(t, pool)
	if got := claimSQL(t, pool, 10); len(got) != 1 || got[0].ID != b {
		t.Fatalf("claimed %v after the head finished, want [%d]", claimedIDs(got), b)
	}
}

// The successor's transaction commits while the head's completion is in
// flight, both ways round, and nothing is left waiting:
//  1. the completion has updated the head (not committed) when the
//     successor's transaction commits: the successor commits at once,
//     waiting, and the completion's commit makes it the head;
//  2. the successor's transaction holds the key's lock (its commit-time
//     fix made early) while the head completes: the completion's commit
//     waits for it, then sees the successor.
func TestKeyHeadFinishRacesSuccessorCommit(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()

	a := enqueueKeyed(t, pool, "k1")
	head := claimSQL(t, pool, 10)
	ctx1, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	wtx, err := pool.Begin(ctx1)
	if err != nil {
		t.Fatal(err)
	}
	defer wtx.Rollback(ctx) //nolint:errcheck
	ids, tokens := idsAndTokens(head)
	if _, err := wtx.Exec(ctx1, sqlCompleteMany, ids, tokens); err != nil {
		t.Fatal(err)
	}
	b := enqueueKeyed(t, pool, "k1") // commits beside the open completion
	if got := claimSQL(t, pool, 10); len(got) != 0 {
		t.Fatalf("claimed %v while the head's completion is uncommitted", claimedIDs(got))
	}
	if err := wtx.Commit(ctx1); err != nil {
		t.Fatal(err)
	}
	headsOK(t, pool)
	if got := claimSQL(t, pool, 10); len(got) != 1 || got[0].ID != b {
		t.Fatalf("claimed %v, want the successor %d of finished %d", claimedIDs(got), b, a)
	}

	// 2. The successor's transaction holds the key's lock (committing)
	// while the completion runs: SET CONSTRAINTS ... IMMEDIATE runs its
	// commit-time fix early, and it commits after the completion.
	enqueueKeyed(t, pool, "k2")
	head2 := claimSQL(t, pool, 10)
	tx, err := pool.Begin(ctx1)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx1) //nolint:errcheck
	c := enqueueKeyed(t, tx, "k2")
	if _, err := tx.Exec(ctx1, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		ids, tokens := idsAndTokens(head2)
		_, err := pool.Exec(ctx1, sqlCompleteMany, ids, tokens)
		done <- err
	}()
	waitUntil(t, "the completion to wait on the held key", func() bool {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n) //nolint:errcheck
		return n > 0
	})
	if err := tx.Commit(ctx1); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	headsOK(t, pool)
	if got := claimSQL(t, pool, 10); len(got) != 1 || got[0].ID != c {
		t.Fatalf("claimed %v, want the successor %d", claimedIDs(got), c)
	}
}

// The race that left a key's head waiting for ever: the head's completion
// decides at its commit that no job follows it (the successor is not
// committed), while the successor's transaction decides that the head is
// still running (the completion is not committed). Here the completion's
// commit-time fix runs first (SET CONSTRAINTS ... IMMEDIATE) and the
// successor commits before the completion does: the successor's fix must
// wait for the key's lock and then see the head finished. Without the
// per-key lock the successor is left waiting behind a finished head.
func TestKeyHeadFinishFixesBeforeSuccessorCommit(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	enqueueKeyed(t, pool, "k")
	head := claimSQL(t, pool, 10)
	ctx1 := ctx
	wtx, err := pool.Begin(ctx1)
	if err != nil {
		t.Fatal(err)
	}
	defer wtx.Rollback(ctx) //nolint:errcheck
	ids, tokens := idsAndTokens(head)
	if _, err := wtx.Exec(ctx1, sqlCompleteMany, ids, tokens); err != nil {
		t.Fatal(err)
	}
	if _, err := wtx.Exec(ctx1, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx1)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	b := enqueueKeyed(t, tx, "k")
	committed := make(chan error, 1)
	go func() { committed <- tx.Commit(ctx1) }()
	// Let the successor's commit reach the key's lock (or finish, when
	// nothing serialises it), then commit the completion.
	var commitErr error
	finished := false
	waitUntil(t, "the successor's commit to wait on the key or finish", func() bool {
		select {
		case commitErr = <-committed:
			finished = true
			return true
		default:
		}
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n) //nolint:errcheck
		return n > 0
	})
	if err := wtx.Commit(ctx1); err != nil {
		t.Fatal(err)
	}
	if !finished {
		commitErr = <-committed
	}
	if commitErr != nil {
		t.Fatal(commitErr)
	}
	headsOK(t, pool)
	if got := claimSQL(t, pool, 10); len(got) != 1 || got[0].ID != b {
		t.Fatalf("claimed %v after the head finished, want its successor %d", claimedIDs(got), b)
	}
}

// Under REPEATABLE READ, a successor enqueued by a transaction whose
// snapshot predates the head's finish either commits claimable or fails
// with a serialization failure, never waits forever.
func TestKeyHeadRepeatableRead(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	enqueueKeyed(t, pool, "k")
	head := claimSQL(t, pool, 10)
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	// The first statement takes the transaction's snapshot.
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM relay_jobs`); err != nil {
		t.Fatal(err)
	}
	completeSQL(t, pool, head...)
	_, err = Enqueue(ctx, tx, keyedArgs{}, &EnqueueOpts{OrderingKey: "k"})
	if err == nil {
		err = tx.Commit(ctx)
	}
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "40001") {
		t.Fatalf("want success or a serialization failure, got %v", err)
	}
	headsOK(t, pool)
	want := 0
	if err == nil {
		want = 1
	}
	if got := claimSQL(t, pool, 10); len(got) != want {
		t.Fatalf("claimed %d jobs after the RR enqueue (err %v), want %d", len(got), err, want)
	}
}

// Cancelling a job behind the head changes nothing; requeueing it puts it
// back in line, ahead of the later jobs of its key.
func TestKeyCancelAndRequeueBehindHead(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	a := enqueueKeyed(t, pool, "k")
	b := enqueueKeyed(t, pool, "k")
	c := enqueueKeyed(t, pool, "k")
	headsOK(t, pool)
	head := claimSQL(t, pool, 10)
	if len(head) != 1 || head[0].ID != a {
		t.Fatalf("claimed %v, want [%d]", claimedIDs(head), a)
	}
	if err := Cancel(ctx, pool, b); err != nil {
		t.Fatal(err)
	}
	headsOK(t, pool)
	if got := claimSQL(t, pool, 10); len(got) != 0 {
		t.Fatalf("claimed %v while the head runs", claimedIDs(got))
	}
	completeSQL(t, pool, head...)
	headsOK(t, pool)
	// c is the head now; requeueing b (earlier) puts c behind it again.
	if err := Requeue(ctx, pool, b); err != nil {
		t.Fatal(err)
	}
	headsOK(t, pool)
	got := claimSQL(t, pool, 10)
	if len(got) != 1 || got[0].ID != b {
		t.Fatalf("claimed %v, want the requeued %d", claimedIDs(got), b)
	}
	completeSQL(t, pool, got...)
	if got := claimSQL(t, pool, 10); len(got) != 1 || got[0].ID != c {
		t.Fatalf("claimed %v, want %d", claimedIDs(got), c)
	}
	// Deleting an unfinished head (behind the API) settles its key too.
	d := enqueueKeyed(t, pool, "k2")
	e := enqueueKeyed(t, pool, "k2")
	if _, err := pool.Exec(ctx, `DELETE FROM relay_jobs WHERE id = $1`, d); err != nil {
		t.Fatal(err)
	}
	headsOK(t, pool)
	if got := claimSQL(t, pool, 10); len(got) != 1 || got[0].ID != e {
		t.Fatalf("claimed %v, want %d", claimedIDs(got), e)
	}
}

// Many keys, concurrent enqueuers (each job its own transaction, and
// batches of several jobs of a key in one transaction) and concurrent
// claimers finishing heads: every job runs, and at rest every key's head
// is claimable and the rest wait.
func TestKeyHeadsUnderConcurrency(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const keys, perEnqueuer, enqueuers = 5, 60, 4
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for e := range enqueuers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perEnqueuer {
				key := fmt.Sprintf("k%d", (e+i)%keys)
				var err error
				if i%5 == 0 {
					_, err = EnqueueMany(ctx, pool, []EnqueueParams{
						{Args: keyedArgs{N: i}, Opts: &EnqueueOpts{OrderingKey: key}},
						{Args: keyedArgs{N: i}, Opts: &EnqueueOpts{OrderingKey: key}},
						{Args: keyedArgs{N: i}, Opts: &EnqueueOpts{OrderingKey: key}},
					})
				} else {
					_, err = Enqueue(ctx, pool, keyedArgs{N: i}, &EnqueueOpts{OrderingKey: key})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	total := enqueuers * (perEnqueuer + 2*perEnqueuer/5)
	var doneMu sync.Mutex
	done := 0
	enqueued := make(chan struct{})
	go func() { wg.Wait(); close(enqueued) }()
	var cwg sync.WaitGroup
	for range 3 {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			for ctx.Err() == nil {
				rows, err := pool.Query(ctx, sqlClaim, DefaultQueue, 5, 60000, "test", [16]byte(uuid.New()))
				if err != nil {
					errs <- err
					return
				}
				got, err := scanClaimed(rows, "test")
				if err != nil {
					errs <- err
					return
				}
				if len(got) > 0 {
					ids, tokens := idsAndTokens(got)
					// As the completer does: rows another transaction
					// holds for a moment are written again.
					for len(ids) > 0 && ctx.Err() == nil {
						res, err := pool.Query(ctx, sqlCompleteMany, ids, tokens)
						if err != nil {
							errs <- err
							return
						}
						var againIDs []int64
						var againTokens []pgtype.UUID
						for res.Next() {
							var id int64
							var ok bool
							if err := res.Scan(&id, &ok); err != nil {
								errs <- err
								return
							}
							if !ok {
								againIDs = append(againIDs, id)
								againTokens = append(againTokens, tokens[0])
							}
						}
						res.Close()
						if err := res.Err(); err != nil {
							errs <- err
							return
						}
						ids, tokens = againIDs, againTokens
						if len(ids) > 0 {
							time.Sleep(time.Millisecond)
						}
					}
				}
				doneMu.Lock()
				done += len(got)
				n := done
				doneMu.Unlock()
				if n >= total {
					return
				}
				if len(got) == 0 {
					select {
					case <-enqueued:
						// Enqueues are over: poll, the backlog must drain.
						time.Sleep(5 * time.Millisecond)
					default:
						time.Sleep(time.Millisecond)
					}
				}
			}
		}()
	}
	cwg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if done != total {
		headsOK(t, pool) // names a key left with no claimable head
		dumpKeys(t, pool)
		t.Fatalf("ran %d of %d jobs; left: %d queued", done, total, total-done)
	}
	headsOK(t, pool)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// dumpKeys logs each key's first unfinished jobs (a failure's context).
func dumpKeys(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT ordering_key, state, key_waiting, count(*), min(id), max(id)
		FROM relay_jobs GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var key, state string
		var waiting bool
		var n, lo, hi int64
		if err := rows.Scan(&key, &state, &waiting, &n, &lo, &hi); err != nil {
			t.Fatal(err)
		}
		t.Logf("key %s %s waiting=%v: %d jobs, ids %d..%d", key, state, waiting, n, lo, hi)
	}
}

// A transaction touching more keys than the sorted pass takes (a bulk
// load: here 600 keys, two jobs each) takes the bulk lock and fixes every
// key: each key's first job is claimable and its second waits.
func TestKeyHeadsBulkManyKeys(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	const keys = 600
	params := make([]EnqueueParams, 0, 2*keys)
	for i := range 2 * keys {
		params = append(params, EnqueueParams{Args: keyedArgs{N: i}, Opts: &EnqueueOpts{OrderingKey: fmt.Sprintf("bulk-key-%d", i%keys)}})
	}
	if _, err := EnqueueMany(ctx, pool, params); err != nil {
		t.Fatal(err)
	}
	headsOK(t, pool)
	var heads int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_jobs WHERE state = 'queued' AND NOT key_waiting`).Scan(&heads); err != nil {
		t.Fatal(err)
	}
	if heads != keys {
		t.Fatalf("%d claimable jobs, want one per key (%d)", heads, keys)
	}
}
