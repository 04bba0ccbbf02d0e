package core_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type coalesceArgs struct {
	N int `json:"n"`
}

func (coalesceArgs) Kind() string { return "coalesce" }

// With polling effectively off, only wake-ups start claims, and with
// ClaimCoalesce off each starts one at once. Single enqueues on a pool,
// back to back and from many goroutines at once, coalesce their wake-ups
// (one sent at once, the rest in one sent a moment later): every job must
// still run. Were the later wake-up dropped rather than deferred, the
// second job of a pair, committed just after the first one's claim, would
// wait for the poll.
func TestCoalescedWakeupsLoseNoJob(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	var mu sync.Mutex
	ran := map[int]bool{}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[coalesceArgs](func(ctx context.Context, j *core.Job[coalesceArgs]) error {
		mu.Lock()
		ran[j.Args.N] = true
		mu.Unlock()
		return nil
	}))
	c := startClient(t, pool, &core.Config{Workers: ws, PollInterval: time.Hour, ClaimCoalesce: -1})
	waitFor(t, "listener connected", func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'`,
			"relay-listener "+c.ID()) > 0
	})
	ranAll := func(from, to int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			for n := from; n < to; n++ {
				if !ran[n] {
					return false
				}
			}
			return true
		}
	}

	// Pairs enqueued at once: the second's wake-up comes within the
	// window of the first's, and is deferred.
	for n := 0; n < 20; n += 2 {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if _, err := core.Enqueue(ctx, pool, coalesceArgs{N: n + i}, nil); err != nil {
					t.Error(err)
				}
			}()
		}
		close(start)
		wg.Wait()
		waitFor(t, "both jobs of a pair enqueued at once ran", ranAll(n, n+2))
	}

	// Many at once, from many goroutines.
	var wg sync.WaitGroup
	for g := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				if _, err := core.Enqueue(ctx, pool, coalesceArgs{N: 100 + 10*g + i}, nil); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	waitFor(t, "every job enqueued at once ran", ranAll(100, 200))
}

// Jobs notified within ClaimCoalesce of the last claim are claimed
// together, by one claim statement (whose jobs share a lease token), once
// the window has passed; a notification after a quiet spell claims at once.
func TestClaimCoalesceClaimsTogether(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	type run struct {
		n     int
		token [16]byte
	}
	ran := make(chan run, 10)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[coalesceArgs](func(ctx context.Context, j *core.Job[coalesceArgs]) error {
		ran <- run{j.Args.N, [16]byte(j.LeaseToken)}
		return nil
	}))
	// The window must outlast the three enqueues below (each its own
	// transaction and notification) after the first claim: a loaded
	// machine could take 2s, and a job committed after the window is
	// claimed alone.
	c := startClient(t, pool, &core.Config{Workers: ws, PollInterval: time.Hour, ClaimCoalesce: 5 * time.Second})
	waitFor(t, "listener connected", func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'`,
			"relay-listener "+c.ID()) > 0
	})
	if _, err := core.Enqueue(ctx, pool, coalesceArgs{N: 0}, nil); err != nil {
		t.Fatal(err)
	}
	first := <-ran
	// Claimed a moment ago: the next three are notified within the window
	// and wait for it to pass, then go in one claim.
	for n := 1; n <= 3; n++ {
		if _, err := core.Enqueue(ctx, pool, coalesceArgs{N: n}, nil); err != nil {
			t.Fatal(err)
		}
	}
	var tokens [][16]byte
	for range 3 {
		r := <-ran
		if r.token == first.token {
			t.Fatalf("job %d shares the first job's claim", r.n)
		}
		tokens = append(tokens, r.token)
	}
	if tokens[0] != tokens[1] || tokens[1] != tokens[2] {
		t.Fatalf("jobs notified within the window were claimed by separate claims (tokens %x)", tokens)
	}
}
