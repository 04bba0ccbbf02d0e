package core_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type pauseArgs struct {
	N int `json:"n"`
}

func (pauseArgs) Kind() string { return "pause.test" }

// TestPauseQueueAcrossClients: a pause stored in the database stops every
// client — here two, each with its own pool, as two processes would be —
// from claiming the queue's jobs, and resume lets both claim again.
func TestPauseQueueAcrossClients(t *testing.T) {
	t.Parallel()
	// A kind limit anywhere sends every claim through the limited claim
	// statement (sqlClaimLimited), which must honour pauses too.
	for _, limited := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain claim", true: "limited claim"}[limited], func(t *testing.T) {
			t.Parallel()
			pauseAcrossClients(t, limited)
		})
	}
}

func pauseAcrossClients(t *testing.T, limited bool) {
	pool := testdb.New(t)
	ctx := context.Background()
	if limited {
		if err := core.SetLimit(ctx, pool, core.Limit{Kind: "some.other.kind", MaxRunning: 5}); err != nil {
			t.Fatal(err)
		}
	}
	pool2, err := pgxpool.New(ctx, pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool2.Close)

	var ran atomic.Int64
	newWorkers := func() *core.Workers {
		ws := core.NewWorkers()
		core.MustAddWorker(ws, core.WorkFunc[pauseArgs](func(ctx context.Context, j *core.Job[pauseArgs]) error {
			ran.Add(1)
			return nil
		}))
		return ws
	}
	const poll = 50 * time.Millisecond
	cfg := func() *core.Config {
		return &core.Config{Workers: newWorkers(), PollInterval: poll,
			Queues: map[string]core.QueueConfig{"pq": {MaxWorkers: 2}, "other": {MaxWorkers: 2}}}
	}
	c1 := startClient(t, pool, cfg())
	c2 := startClient(t, pool2, cfg())

	was, err := core.PauseQueue(ctx, pool, "pq", "test")
	if err != nil || !was {
		t.Fatalf("pause: %v %v", was, err)
	}
	if again, err := core.PauseQueue(ctx, pool, "pq", "test"); err != nil || again {
		t.Fatalf("second pause: %v %v", again, err)
	}
	paused, err := core.PausedQueues(ctx, pool)
	if err != nil || len(paused) != 1 || paused[0].Queue != "pq" || paused[0].PausedBy != "test" {
		t.Fatalf("paused queues: %+v %v", paused, err)
	}

	var ids []int64
	for i := range 10 {
		r, err := core.Enqueue(ctx, pool, pauseArgs{N: i}, &core.EnqueueOpts{Queue: "pq"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	// Another queue keeps running: the clients are alive and claiming.
	other, err := core.Enqueue(ctx, pool2, pauseArgs{N: -1}, &core.EnqueueOpts{Queue: "other"})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, pool, other.ID, core.StateSucceeded)

	// The enqueue notified both clients and they have polled several times
	// since: a negative check needs a window, and this one is ten poll
	// intervals after the other queue's job finished.
	time.Sleep(10 * poll)
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs WHERE queue = 'pq' AND state <> 'queued'`); n != 0 {
		t.Fatalf("%d jobs of the paused queue left queued", n)
	}

	if was, err := core.ResumeQueue(ctx, pool2, "pq"); err != nil || !was {
		t.Fatalf("resume: %v %v", was, err)
	}
	for _, id := range ids {
		waitState(t, pool, id, core.StateSucceeded)
	}
	if c1.Stats().Claimed+c2.Stats().Claimed != 11 || ran.Load() != 11 {
		t.Fatalf("claimed %d+%d, ran %d; want 11", c1.Stats().Claimed, c2.Stats().Claimed, ran.Load())
	}
	if again, err := core.ResumeQueue(ctx, pool, "pq"); err != nil || again {
		t.Fatalf("second resume: %v %v", again, err)
	}
}

// TestPauseQueueInTransaction: a pause made in a rolled-back transaction
// never happened.
func TestPauseQueueInTransaction(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := core.PauseQueue(ctx, tx, "q", "t"); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	if p, err := core.PausedQueues(ctx, pool); err != nil || len(p) != 0 {
		t.Fatalf("paused after rollback: %+v %v", p, err)
	}
	if _, err := core.PauseQueue(ctx, pool, "", "t"); err == nil {
		t.Fatal("empty queue name accepted")
	}
}
