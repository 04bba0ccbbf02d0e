package core_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

type seqArgs struct {
	Key string `json:"key"`
	N   int    `json:"n"`
}

func (seqArgs) Kind() string { return "seq" }

// Jobs sharing an ordering key run one at a time in enqueue order — through
// a retry and a dead job — while other keys run beside them.
func TestOrderingKeys(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()

	var mu sync.Mutex
	running := map[string]int{}
	var order []string
	var overlap []string
	b1Started := make(chan struct{})
	failedOnce, cFailed := false, false
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[seqArgs](func(ctx context.Context, j *core.Job[seqArgs]) error {
		mu.Lock()
		running[j.Args.Key]++
		if running[j.Args.Key] > 1 {
			overlap = append(overlap, j.Args.Key)
		}
		order = append(order, j.Args.Key+string(rune('0'+j.Args.N)))
		first := j.Args.Key == "a" && j.Args.N == 1
		fail := first && !failedOnce
		failedOnce = failedOnce || first
		mu.Unlock()
		defer func() { mu.Lock(); running[j.Args.Key]--; mu.Unlock() }()
		switch {
		case j.Args.Key == "b" && j.Args.N == 1:
			close(b1Started)
		case first && !fail:
			// a1 (second attempt) finishes only once key b has started: keys
			// run in parallel.
			select {
			case <-b1Started:
			case <-time.After(10 * time.Second):
				return errors.New("key b never started while key a ran")
			}
		case j.Args.Key == "c" && j.Args.N == 1:
			mu.Lock()
			again := cFailed
			cFailed = true
			mu.Unlock()
			if !again {
				return core.Permanent(errors.New("c1 fails for good"))
			}
		}
		if fail {
			return core.RetryIn(0, errors.New("a1 fails once"))
		}
		return nil
	}))

	var params []core.EnqueueParams
	for _, job := range []seqArgs{{"a", 1}, {"a", 2}, {"a", 3}, {"b", 1}, {"b", 2}, {"c", 1}, {"c", 2}} {
		params = append(params, core.EnqueueParams{Args: job, Opts: &core.EnqueueOpts{OrderingKey: job.Key}})
	}
	res, err := core.EnqueueMany(ctx, pool, params)
	if err != nil {
		t.Fatal(err)
	}
	c1, c2 := res[5].ID, res[6].ID
	c := startClient(t, pool, &core.Config{Workers: ws, Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 10}}})

	waitFor(t, "a and b to finish and c1 to die", func() bool {
		return c.Stats().Succeeded == 5 && jobState(t, pool, c1) == core.StateDead
	})
	if jobState(t, pool, c2) != core.StateQueued {
		t.Fatalf("c2 ran behind a dead c1")
	}
	blocked, err := core.BlockedKeys(ctx, pool, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocked) != 1 || blocked[0].Key != "c" || blocked[0].JobID != c1 || blocked[0].Waiting != 1 {
		t.Fatalf("blocked keys %+v", blocked)
	}
	// Requeueing the dead head (fixed, it now succeeds) unblocks the key,
	// in order.
	if err := core.Requeue(ctx, pool, c1); err != nil {
		t.Fatal(err)
	}
	waitState(t, pool, c2, core.StateSucceeded)
	if jobState(t, pool, c1) != core.StateSucceeded {
		t.Errorf("c1 is %s", jobState(t, pool, c1))
	}

	mu.Lock()
	defer mu.Unlock()
	if len(overlap) > 0 {
		t.Errorf("jobs of one key overlapped: %v", overlap)
	}
	pos := map[string]int{}
	for i, s := range order {
		if _, seen := pos[s]; !seen {
			pos[s] = i
		}
	}
	for _, chain := range [][]string{{"a1", "a2", "a3"}, {"b1", "b2"}, {"c1", "c2"}} {
		for i := 1; i < len(chain); i++ {
			if pos[chain[i-1]] > pos[chain[i]] {
				t.Errorf("%s started before %s: %v", chain[i], chain[i-1], order)
			}
		}
	}
	// a1 ran twice (the retry) before a2 ever started.
	aRuns := 0
	for _, s := range order {
		if s == "a2" {
			break
		}
		if s == "a1" {
			aRuns++
		}
	}
	if aRuns != 2 {
		t.Errorf("a1 ran %d times before a2 started, want 2 (its retry first): %v", aRuns, order)
	}
}
