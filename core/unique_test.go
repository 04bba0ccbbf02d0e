package core_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type syncArgs struct {
	Account string `json:"account"`
}

func (syncArgs) Kind() string { return "sync" }

func TestUniqueJobs(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	byArgs := &core.EnqueueOpts{Unique: &core.UniqueOpts{}}

	first, err := core.Enqueue(ctx, pool, syncArgs{Account: "a"}, byArgs)
	if err != nil || first.Duplicate {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := core.Enqueue(ctx, pool, syncArgs{Account: "a"}, byArgs)
	if err != nil || !again.Duplicate || again.ID != first.ID {
		t.Fatalf("same args again: %+v %v; want a duplicate of %d", again, err, first.ID)
	}
	other, err := core.Enqueue(ctx, pool, syncArgs{Account: "b"}, byArgs)
	if err != nil || other.Duplicate {
		t.Fatalf("other args: %+v %v", other, err)
	}
	plain, err := core.Enqueue(ctx, pool, syncArgs{Account: "a"}, nil)
	if err != nil || plain.Duplicate {
		t.Fatalf("without Unique: %+v %v", plain, err)
	}

	// An explicit key, in a batch: repeats within the batch and of the
	// table are duplicates; the batch keeps its order.
	keyed := func(k string) *core.EnqueueOpts { return &core.EnqueueOpts{Unique: &core.UniqueOpts{Key: k}} }
	res, err := core.EnqueueMany(ctx, pool, []core.EnqueueParams{
		{Args: syncArgs{Account: "x"}, Opts: keyed("k1")},
		{Args: syncArgs{Account: "y"}, Opts: keyed("k1")},
		{Args: syncArgs{Account: "z"}},
		{Args: syncArgs{Account: "a"}, Opts: byArgs},
		{Args: syncArgs{Account: "w"}, Opts: keyed("k2")},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []bool{false, true, false, true, false}
	for i, r := range res {
		if r.Duplicate != want[i] {
			t.Errorf("batch job %d: duplicate=%v, want %v", i, r.Duplicate, want[i])
		}
	}
	if res[1].ID != res[0].ID || res[3].ID != first.ID || res[2].ID == res[0].ID || res[4].ID == res[0].ID {
		t.Errorf("batch ids %+v", res)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs`); n != 6 {
		t.Errorf("%d jobs, want 6", n)
	}

	// Once the job finishes, the key is free (default states: queued, claimed).
	if err := core.Cancel(ctx, pool, first.ID); err != nil {
		t.Fatal(err)
	}
	after, err := core.Enqueue(ctx, pool, syncArgs{Account: "a"}, byArgs)
	if err != nil || after.Duplicate {
		t.Fatalf("after the first finished: %+v %v", after, err)
	}
	// Requeueing the cancelled one would make two: refused, clearly.
	if err := core.Requeue(ctx, pool, first.ID); !errors.Is(err, core.ErrUniqueConflict) {
		t.Errorf("requeue into a held key: %v, want ErrUniqueConflict", err)
	}

	// States including succeeded keep the key after success.
	withDone := &core.EnqueueOpts{Unique: &core.UniqueOpts{Key: "once", States: []core.JobState{core.StateQueued, core.StateClaimed, core.StateSucceeded}}}
	j, err := core.Enqueue(ctx, pool, syncArgs{}, withDone)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'claimed', lease_token = gen_random_uuid(), lease_expires_at = now() WHERE id = $1`, j.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'succeeded', lease_token = NULL, lease_expires_at = NULL, finalized_at = now() WHERE id = $1`, j.ID); err != nil {
		t.Fatal(err)
	}
	if r, err := core.Enqueue(ctx, pool, syncArgs{}, withDone); err != nil || !r.Duplicate || r.ID != j.ID {
		t.Errorf("succeeded job should still hold its key: %+v %v", r, err)
	}
}

func TestUniqueValidation(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	for _, u := range []*core.UniqueOpts{
		{States: []core.JobState{core.StateQueued}},
		{States: []core.JobState{core.StateQueued, core.StateClaimed, "paused"}},
		{Period: -time.Second},
	} {
		_, err := core.Enqueue(context.Background(), pool, syncArgs{}, &core.EnqueueOpts{Unique: u})
		var ve *core.ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("%+v: got %v, want a ValidationError", u, err)
		}
	}
}

// Many connections enqueue the same unique job at once: exactly one row,
// and every caller learns its id.
func TestUniqueRaceAcrossConnections(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	ctx := context.Background()
	var pools []*pgxpool.Pool
	for range 8 {
		p, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		pools = append(pools, p)
	}
	for round := range 20 {
		opts := &core.EnqueueOpts{Unique: &core.UniqueOpts{Key: "race-" + string(rune('a'+round))}}
		ids := make([]int64, 32)
		dups := make([]bool, 32)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				// Half in their own transaction, committed after a beat.
				p := pools[i%len(pools)]
				if i%2 == 0 {
					r, err := core.Enqueue(ctx, p, syncArgs{}, opts)
					if err != nil {
						t.Error(err)
					}
					ids[i], dups[i] = r.ID, r.Duplicate
					return
				}
				tx, err := p.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				r, err := core.Enqueue(ctx, tx, syncArgs{}, opts)
				if err != nil {
					t.Error(err)
					tx.Rollback(ctx)
					return
				}
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
				}
				ids[i], dups[i] = r.ID, r.Duplicate
			}()
		}
		close(start)
		wg.Wait()
		inserted := 0
		for i := range ids {
			if !dups[i] {
				inserted++
			}
			if ids[i] != ids[0] {
				t.Fatalf("round %d: callers got different ids: %v", round, ids)
			}
		}
		if inserted != 1 {
			t.Fatalf("round %d: %d callers inserted, want 1", round, inserted)
		}
	}
	if n := count(t, pools[0], `SELECT count(*) FROM relay_jobs`); n != 20 {
		t.Errorf("%d jobs for 20 keys", n)
	}
}

// Enqueueing a duplicate of a running unique job in a transaction takes no
// lock on the running job's row.
func TestDuplicateEnqueueLocksNothing(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	opts := &core.EnqueueOpts{Unique: &core.UniqueOpts{Key: "k"}}
	first, err := core.Enqueue(ctx, pool, heldArgs{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_jobs SET state = 'claimed', attempt = 1, lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute' WHERE id = $1`, first.ID); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	dup, err := core.EnqueueMany(ctx, tx, []core.EnqueueParams{
		{Args: heldArgs{N: 1}, Opts: opts},
		{Args: heldArgs{N: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !dup[0].Duplicate || dup[0].ID != first.ID || dup[1].Duplicate || dup[1].ID == 0 {
		t.Fatalf("results %+v, want a duplicate of %d and a new job", dup, first.ID)
	}
	if _, err := pool.Exec(ctx, `SELECT 1 FROM relay_jobs WHERE id = $1 FOR UPDATE NOWAIT`, first.ID); err != nil {
		t.Fatalf("the running job's row is locked by the duplicate enqueue: %v", err)
	}
}
