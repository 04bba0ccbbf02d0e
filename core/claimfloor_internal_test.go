package core

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/testkit/testdb"
)

type floorArgs struct{}

func (floorArgs) Kind() string { return "floor" }

// floorQueue is a bare queue of a bare client, for driving claims and
// probes by hand.
func floorQueue(pool *pgxpool.Pool, name string) *queue {
	c := &Client{pool: pool, own: pool, outcomes: pool, logger: slog.Default(), cfg: Config{ID: "floor-test", LeaseDuration: 30e9, PollInterval: 50 * time.Millisecond}}
	c.completer = newCompleter(c)
	return &queue{client: c, name: name}
}

func enqueueFloor(t *testing.T, pool *pgxpool.Pool, o EnqueueOpts) int64 {
	t.Helper()
	res, err := Enqueue(context.Background(), pool, floorArgs{}, &o)
	if err != nil {
		t.Fatal(err)
	}
	return res.ID
}

func claimIDs(t *testing.T, q *queue) []int64 {
	t.Helper()
	rows, err := q.claim(context.Background(), 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	return ids
}

// A floor set past a priority-0 job that became queued later (one enqueued
// with a RunAt in the past, here) hides it from claims until a full probe
// lowers the floor before it; jobs of other priorities are never behind the
// floor, whose priority is 0. Without the full probe's step the job would
// starve while the floor is on.
func TestClaimFloorFullProbeFindsJobsBehindIt(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	q := floorQueue(pool, "floor-behind")
	q.floor.set(true, claimCursor{0, time.Now(), 0})
	past := time.Now().Add(-time.Hour)
	behind := enqueueFloor(t, pool, EnqueueOpts{Queue: q.name, RunAt: past})
	lower := enqueueFloor(t, pool, EnqueueOpts{Queue: q.name, RunAt: past, Priority: new(1)})

	if got := claimIDs(t, q); len(got) != 1 || got[0] != lower {
		t.Fatalf("claim with the floor took %v, want only the priority-1 job %d", got, lower)
	}
	at, err := q.probeFloor(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	q.floor.set(true, at)
	if got := claimIDs(t, q); len(got) != 1 || got[0] != behind {
		t.Fatalf("claim after the full probe took %v, want %d", got, behind)
	}
}

// A probe never raises the floor past a queued job, even one its claims
// cannot take yet (the second job of an ordering key whose first is
// running): once the first finishes, a claim from the floor takes it.
func TestClaimFloorStaysBeforeBlockedKey(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	q := floorQueue(pool, "floor-keys")
	past := time.Now().Add(-time.Hour)
	first := enqueueFloor(t, pool, EnqueueOpts{Queue: q.name, RunAt: past, OrderingKey: "k"})
	second := enqueueFloor(t, pool, EnqueueOpts{Queue: q.name, RunAt: past, OrderingKey: "k"})
	rows, err := q.claim(ctx, 10, nil)
	if err != nil || len(rows) != 1 || rows[0].ID != first {
		t.Fatalf("first claim: %v, %v; want job %d alone", rows, err, first)
	}
	at, err := q.probeFloor(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if at, err = q.probeFloor(ctx, &at); err != nil { // a forward probe too
		t.Fatal(err)
	}
	q.floor.set(true, at)
	if got := claimIDs(t, q); len(got) != 0 {
		t.Fatalf("claimed %v while the key's first job runs", got)
	}
	if done, err := q.client.completer.write(ctx, outcomeSuccess, []outcome{{row: rows[0], kind: outcomeSuccess}}); err != nil || len(done) != 1 {
		t.Fatalf("complete: %v, %v", done, err)
	}
	if got := claimIDs(t, q); len(got) != 1 || got[0] != second {
		t.Fatalf("claim from the floor took %v, want the key's second job %d", got, second)
	}
}

// The keeper turns the floor on when the front of the claim index is dead
// ground (20,000 jobs claimed and finished while a transaction holds the
// xmin horizon): a claim from the floor then touches a handful of buffers
// where one from the front touches hundreds. A job that becomes queued
// behind the floor is reached by the keeper's next full probe. Once VACUUM
// has cleared the front, the floor goes off.
func TestClaimFloorKeeper(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	q := floorQueue(pool, "floor-keeper")
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT txid_current()`); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`INSERT INTO relay_jobs (kind, queue) SELECT 'floor', 'floor-keeper' FROM generate_series(1, 20000)`,
		`UPDATE relay_jobs SET state = 'claimed', attempt = 1, lease_token = gen_random_uuid(), lease_expires_at = now() WHERE queue = 'floor-keeper'`,
		`UPDATE relay_jobs SET state = 'succeeded', lease_token = NULL, lease_expires_at = NULL, finalized_at = now() WHERE queue = 'floor-keeper'`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	keeperCtx, stop := context.WithCancel(ctx)
	defer stop()
	go q.keepFloor(keeperCtx)
	var at claimCursor
	testdb.WaitFor(t, "the floor to go on", func() bool {
		var on bool
		at, on = q.floor.get()
		return on
	})
	fromFront := claimBuffersTB(t, pool, sqlClaim, q.name)
	fromFloor := claimBuffersTB(t, pool, sqlClaimAfter, q.name, int16(at.priority), at.runAt, at.id)
	if fromFront < floorOnBuffers || fromFloor > 20 {
		t.Fatalf("a claim from the front touches %d buffers, one from the floor %d: want ≥ %d and ≤ 20", fromFront, fromFloor, floorOnBuffers)
	}
	// The claim a steady load sends from the floor (sqlClaimFrom, every
	// priority after it) starts at the floor too, once there are jobs
	// after it: it touched 142 buffers here when its walk of the floor's
	// priority began at that priority's front.
	if _, err := pool.Exec(ctx, `INSERT INTO relay_jobs (kind, queue) SELECT 'floor', 'floor-keeper' FROM generate_series(1, 5)`); err != nil {
		t.Fatal(err)
	}
	if fromFloorAll := claimBuffersTB(t, pool, sqlClaimFrom, q.name, int16(at.priority), at.runAt, at.id); fromFloorAll > 40 {
		t.Fatalf("a claim from the floor over every priority (sqlClaimFrom) touches %d buffers, want ≤ 40 (the walk from the floor touches %d)", fromFloorAll, fromFloor)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM relay_jobs WHERE queue = 'floor-keeper' AND state = 'queued'`); err != nil {
		t.Fatal(err)
	}

	behind := enqueueFloor(t, pool, EnqueueOpts{Queue: q.name, RunAt: time.Now().Add(-time.Hour)})
	testdb.WaitFor(t, "the job behind the floor to be claimed", func() bool {
		rows, err := q.claim(ctx, 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		return len(rows) == 1 && rows[0].ID == behind
	})

	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	testdb.WaitFor(t, "the floor to go off after VACUUM", func() bool {
		if _, err := pool.Exec(ctx, `VACUUM relay_jobs`); err != nil {
			t.Fatal(err)
		}
		_, on := q.floor.get()
		return !on
	})
}

// claimBuffersTB runs claim statement sql (sqlClaim's parameters, then
// extra) under EXPLAIN (ANALYZE, BUFFERS) and returns the shared buffers it
// touched.
func claimBuffersTB(t testing.TB, pool *pgxpool.Pool, sql, queue string, extra ...any) int64 {
	t.Helper()
	args := append([]any{queue, 1, int64(30000), "explain", [16]byte(uuid.New())}, extra...)
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) // the claim, if it took a job
	var js []byte
	if err := tx.QueryRow(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&js); err != nil {
		t.Fatal(err)
	}
	var plan []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(js, &plan); err != nil || len(plan) != 1 {
		t.Fatalf("explain: %v", err)
	}
	return plan[0].Plan.Hit + plan[0].Plan.Read
}

// A client's keepers measure their queues' fronts (an EXPLAIN each, planned
// afresh every time) every PollInterval, at least a second, but a client of
// many queues spaces them so that it sends at most about 100 a second: at
// 1,000 queues checked every second they cost PostgreSQL more than the
// queues' claims did.
func TestFloorChecksSpacedOverManyQueues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		queues int
		poll   time.Duration
		want   time.Duration
	}{
		{1, 50 * time.Millisecond, time.Second},
		{1, 3 * time.Second, 3 * time.Second},
		{100, time.Second, time.Second},
		{1000, time.Second, 10 * time.Second},
		{1000, 30 * time.Second, 30 * time.Second},
	} {
		c := &Client{cfg: Config{PollInterval: tc.poll}, queues: map[string]*queue{}}
		for i := range tc.queues {
			c.queues[fmt.Sprint("q", i)] = &queue{client: c}
		}
		got := c.floorCheckPeriod()
		if got != tc.want {
			t.Errorf("%d queues, PollInterval %v: a keeper checks every %v, want %v", tc.queues, tc.poll, got, tc.want)
		}
		if perSecond := float64(tc.queues) / got.Seconds(); perSecond > 100 {
			t.Errorf("%d queues, PollInterval %v: %.0f checks a second, want at most 100", tc.queues, tc.poll, perSecond)
		}
	}
}

// A queue that claims many jobs is measured at the unspaced period even
// in a client of many queues: its front fills with dead entries at its own
// rate while a horizon is held (a hostile review found a hot queue among
// 1,000 waiting 10-20 s for its floor). A quiet one waits for the spaced
// period.
func TestFloorCheckDueForAHotQueueAmongMany(t *testing.T) {
	t.Parallel()
	c := &Client{cfg: Config{PollInterval: time.Second}, queues: map[string]*queue{}}
	for i := range 1000 {
		c.queues[fmt.Sprint("q", i)] = &queue{client: c}
	}
	spaced := c.floorCheckPeriod()
	hot, quiet := c.queues["q0"], c.queues["q1"]
	hot.floorClaims.Store(floorCheckJobs)
	quiet.floorClaims.Store(floorCheckJobs - 1)
	if !hot.floorCheckDue(time.Second, spaced) {
		t.Errorf("a queue that claimed %d jobs since its check a second ago is not due (spaced period %v)", floorCheckJobs, spaced)
	}
	if quiet.floorCheckDue(time.Second, spaced) {
		t.Errorf("a queue that claimed %d jobs since its check a second ago is due before the spaced period %v", floorCheckJobs-1, spaced)
	}
	if !quiet.floorCheckDue(spaced, spaced) {
		t.Errorf("a quiet queue is not due after the spaced period %v", spaced)
	}
}
