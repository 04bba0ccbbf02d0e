package core_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/devpg"
	"github.com/relayq/relay/testkit/testdb"
)

// A client of more queues than it has claim connections (they share 16)
// keeps its running jobs' leases while every queue's claim waits on a
// limit row a caller's transaction holds for two leases: the claims queue
// on the lock (each up to lock_timeout), and the heartbeat, on a
// connection of its own, still renews.
func TestSharedClaimConnectionsStarveNoHeartbeat(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	h, ws := newHolder()
	lease := 3 * time.Second
	qs := map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}
	for i := range 40 {
		qs[fmt.Sprintf("q%d", i)] = core.QueueConfig{MaxWorkers: 1}
	}
	// Any kind limit makes every queue's claim lock the limit rows.
	if err := core.SetLimit(ctx, pool, core.Limit{Kind: "elsewhere", MaxRunning: 5}); err != nil {
		t.Fatal(err)
	}
	c := startClient(t, pool, &core.Config{Workers: ws, LeaseDuration: lease, PollInterval: 20 * time.Millisecond,
		RescueInterval: 50 * time.Millisecond, Queues: qs})
	res, err := core.Enqueue(ctx, pool, heldArgs{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-h.started

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var lockedAt time.Time
	if err := tx.QueryRow(ctx, `SELECT max(now()) FROM (SELECT 1 FROM relay_limits FOR UPDATE) AS l`).Scan(&lockedAt); err != nil {
		t.Fatal(err)
	}
	waitDBTime(t, pool, lockedAt.Add(2*lease))
	if n := count(t, pool, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE NOT l.granted AND a.application_name = $1`, "relay-worker "+c.ID()); n == 0 {
		t.Log("no claim was waiting on the limit rows at the end (each waits up to lock_timeout)")
	}
	if _, ok := h.ended(res.ID); ok {
		t.Fatal("the running job's handler was cancelled while the claims waited on the limit rows")
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE id = $1 AND state = 'claimed' AND attempt = 1 AND lease_expires_at > now()`, res.ID); n != 1 {
		t.Fatal("the running job's lease was not renewed while the claims waited on the limit rows")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	h.ch(res.ID) <- nil
	waitState(t, pool, res.ID, core.StateSucceeded)
	if s := c.Stats(); s.LeaseLost != 0 {
		t.Fatalf("LeaseLost = %d, want 0", s.LeaseLost)
	}
}

// The same through PgBouncer, which refuses lock_timeout as a startup
// parameter: the bookkeeping connections go without it, so each claim
// waits on the limit rows until its statement's own timeout, and more
// queues than claim connections can hold every one of them. The heartbeat,
// on a connection no claim can take, renews the running job's lease all
// the same (checked on lease_expires_at, renewed past the lock's second
// lease), its handler is not cancelled, and nothing counts a lost lease.
// On the bookkeeping pool it shared with the claims, its renewals waited
// for a connection until the local lease deadline cancelled the handler.
func TestSharedClaimConnectionsStarveNoHeartbeatWithoutLockTimeout(t *testing.T) {
	t.Parallel()
	b := testdb.PgBouncer(t, devpg.BouncerOptions{PoolMode: "session", PoolSize: 60})
	direct := testdb.URL(t)
	pool := openPool(t, direct)
	through := openPool(t, testdb.Through(b, direct))
	ctx := context.Background()
	h, ws := newHolder()
	lease := 3 * time.Second
	qs := map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}
	for i := range 40 {
		qs[fmt.Sprintf("q%d", i)] = core.QueueConfig{MaxWorkers: 1}
	}
	if err := core.SetLimit(ctx, pool, core.Limit{Kind: "elsewhere", MaxRunning: 5}); err != nil {
		t.Fatal(err)
	}
	c := startClient(t, through, &core.Config{Workers: ws, LeaseDuration: lease, PollInterval: 20 * time.Millisecond,
		RescueInterval: 50 * time.Millisecond, Queues: qs})
	res, err := core.Enqueue(ctx, pool, heldArgs{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-h.started
	var token string
	if err := pool.QueryRow(ctx, `SELECT lease_token::text FROM relay_jobs WHERE id = $1`, res.ID).Scan(&token); err != nil {
		t.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var lockedAt time.Time
	if err := tx.QueryRow(ctx, `SELECT max(now()) FROM (SELECT 1 FROM relay_limits FOR UPDATE) AS l`).Scan(&lockedAt); err != nil {
		t.Fatal(err)
	}
	// Every claim connection waits on the lock before the lease is due:
	// the starvation this test is about.
	waitFor(t, "every claim connection waiting on the limit rows", func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE NOT l.granted AND l.relation = 'relay_limits'::regclass`) >= 16
	})
	waitFor(t, "the running job's lease renewed past the lock's second lease", func() bool {
		var state string
		var attempt int
		var tok *string
		var exp *time.Time
		if err := pool.QueryRow(ctx, `SELECT state, attempt, lease_token::text, lease_expires_at FROM relay_jobs WHERE id = $1`, res.ID).
			Scan(&state, &attempt, &tok, &exp); err != nil {
			t.Fatal(err)
		}
		if state != string(core.StateClaimed) || attempt != 1 || tok == nil || *tok != token {
			t.Fatalf("the running job lost its lease while the claims waited on the limit rows: state %s, attempt %d", state, attempt)
		}
		return exp.After(lockedAt.Add(2 * lease))
	})
	if _, ok := h.ended(res.ID); ok {
		t.Fatal("the running job's handler was cancelled while the claims waited on the limit rows")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	h.ch(res.ID) <- nil
	waitState(t, pool, res.ID, core.StateSucceeded)
	if s := c.Stats(); s.LeaseLost != 0 {
		t.Fatalf("LeaseLost = %d, want 0", s.LeaseLost)
	}
}
