package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/workflow"
)

// Terminate racing a run's completion, at every moment from its start to
// its end: each Terminate that returned nil ends its run terminated (never
// completed), each that said the run finished names "completed", whose
// output stands; a terminated run's StepTx effects are those of the steps
// it checkpointed, each once.
func TestTerminateRacingCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.exec(`CREATE TABLE effects (run_id text, step text)`)
	wf := workflow.MustRegister(b.reg, "short-tx", func(wctx workflow.Context, n int) (int, error) {
		for i := range 3 {
			key := fmt.Sprint("s", i)
			if _, err := workflow.StepTx(wctx, key, func(ctx context.Context, tx pgx.Tx) (int, error) {
				_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2)`, wctx.RunID(), key)
				return i, err
			}, nil); err != nil {
				return 0, err
			}
		}
		return n, nil
	})
	b.start()
	const runs = 30
	ids := make([]string, runs)
	errs := make([]error, runs)
	var wg sync.WaitGroup
	for i := range runs {
		h, err := workflow.Start(ctx, b.pool, wf, i, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = h.ID
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 3 * time.Millisecond) // spread over the runs' lives
			errs[i] = workflow.Terminate(ctx, b.pool, ids[i], "race")
		}()
	}
	wg.Wait()
	outcomes := map[string]int{}
	for i, id := range ids {
		out, err := result[int](t, b.pool, id)
		switch {
		case errs[i] == nil && errors.Is(err, workflow.ErrRunTerminated):
			outcomes["terminated"]++
		case errors.Is(errs[i], workflow.ErrRunFinished) && strings.Contains(errs[i].Error(), "completed") && err == nil && out == i:
			outcomes["completed"]++
		default:
			t.Fatalf("run %d: Terminate said %v, the run ended %d, %v", i, errs[i], out, err)
		}
		checkpointed := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND kind = 'tx' AND state = 'completed'`, id)
		effects := b.count(`SELECT count(*) FROM effects WHERE run_id = $1`, id)
		distinct := b.count(`SELECT count(DISTINCT step) FROM effects WHERE run_id = $1`, id)
		if effects != checkpointed || distinct != effects {
			t.Fatalf("run %d: %d StepTx checkpointed, %d effects (%d distinct)", i, checkpointed, effects, distinct)
		}
	}
	t.Logf("outcomes: %v", outcomes)
}

// Terminate while a failed run runs its compensations: the run ends
// terminated, the compensation running is not checkpointed, the older
// ones never run, and a Cancel or Retry of it after is refused.
func TestTerminateDuringCompensation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	g := newGate()
	var mu sync.Mutex
	undone := map[string]int{}
	wf := workflow.MustRegister(b.reg, "undo-terminated", func(wctx workflow.Context, _ int) (int, error) {
		for _, key := range []string{"a", "b"} {
			if _, err := workflow.Step(wctx, key, func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
				return 0, err
			}
			workflow.Compensate(wctx, "undo-"+key, func(ctx context.Context) error {
				mu.Lock()
				undone[key]++
				mu.Unlock()
				if key == "b" {
					g.pass()
				}
				return nil
			})
		}
		return 0, errors.New("a check failed")
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	g.waitEntered(t)
	if err := workflow.Terminate(ctx, b.pool, h.ID, "stop undoing"); err != nil {
		t.Fatal(err)
	}
	close(g.open)
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunTerminated) {
		t.Fatalf("want terminated, got %v", err)
	}
	b.waitFor("the terminated run's job ended", func() bool {
		return b.count(`SELECT count(*) FROM relay_jobs WHERE args->>'run_id' = $1 AND state IN ('claimed', 'queued', 'scheduled')`, h.ID) == 0
	})
	mu.Lock()
	if undone["a"] != 0 {
		mu.Unlock()
		t.Fatalf("compensations ran %v after the Terminate", undone)
	}
	mu.Unlock()
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key LIKE 'compensate:%' AND state = 'completed'`, h.ID); n != 0 {
		t.Fatalf("%d compensations checkpointed after the Terminate", n)
	}
	if err := workflow.Cancel(ctx, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFinished) || !strings.Contains(err.Error(), "terminated") {
		t.Fatalf("cancel of the terminated run: %v", err)
	}
	if err := workflow.Retry(ctx, b.pool, h.ID); !errors.Is(err, workflow.ErrNotRetryable) {
		t.Fatalf("retry of the terminated run: %v", err)
	}
}
