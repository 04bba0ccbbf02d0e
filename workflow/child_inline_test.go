package workflow_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// A parent waiting for a child it just started executes the child in its
// own worker slot: with one slot, the parent never suspends, each child
// runs once (one attempt of its job, claimed by the parent's client), and
// the children's outcomes (a failure included) reach the parent as they do
// through the queue.
func TestChildExecutedInItsParentsSlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	echo := workflow.MustRegister(b.reg, "echo", func(wctx workflow.Context, s string) (string, error) {
		return workflow.Step(wctx, "say", func(ctx context.Context) (string, error) { return "said " + s, nil }, nil)
	})
	broken := workflow.MustRegister(b.reg, "broken", func(wctx workflow.Context, _ string) (string, error) {
		return "", errors.New("report generator down")
	})
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, _ int) ([]string, error) {
		var out []string
		for _, k := range []string{"a", "b"} {
			s, err := workflow.Child(wctx, k, echo, k, nil).Get(wctx)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		_, err := workflow.Child(wctx, "r", broken, "", nil).Get(wctx)
		var ce *workflow.ChildError
		if !errors.As(err, &ce) || ce.State != workflow.StateFailed || !strings.Contains(ce.Message, "generator down") {
			return nil, errors.New("want ChildError, got " + errString(err))
		}
		return out, nil
	})
	// One slot: while the parent holds it, no fetch loop claims a child.
	b.startWith(&core.Config{Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	h, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "p"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := result[[]string](t, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0] != "said a" || out[1] != "said b" {
		t.Fatalf("out %v", out)
	}
	st := b.reg.Stats()
	if st.Suspended != 0 || st.Executions != 4 {
		t.Fatalf("stats %+v: want 4 executions (the parent's one and each child's), none suspended", st)
	}
	// The jobs' successes are recorded by the core after the runs' ends.
	b.waitFor("the children's jobs succeeded", func() bool {
		return b.count(`SELECT count(*) FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id
			WHERE r.parent_id = 'p' AND j.state = 'succeeded'`) == 3
	})
	if n := b.count(`SELECT count(*) FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id
		WHERE r.parent_id = 'p' AND j.attempt = 1`); n != 3 {
		t.Fatalf("%d children's jobs took one attempt, want 3", n)
	}
	// The history is the one the queue would have written: a replay of the
	// parent (Retry after a failure, say) returns the stored outcomes.
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'p' AND kind = 'child' AND state IN ('completed', 'failed')`); n != 3 {
		t.Fatalf("%d child checkpoints settled, want 3", n)
	}
}

// A child on another queue than its parent's is not executed in the
// parent's slot: that queue's own workers and concurrency run it, and the
// parent suspends meanwhile.
func TestChildNotExecutedInTheParentsSlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	gate := make(chan struct{})
	echo := workflow.MustRegister(b.reg, "echo", func(wctx workflow.Context, s string) (string, error) {
		select { // outside a step: the run's end is the first write after it
		case <-gate:
		case <-wctx.Done():
			return "", wctx.Err()
		}
		return s, nil
	})
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, _ int) (string, error) {
		return workflow.Child(wctx, "other", echo, "x", &workflow.ChildOpts{Queue: "other"}).Get(wctx)
	})
	b.start(core.DefaultQueue, "other")
	h, err := workflow.Start(ctx, b.pool, parent, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.waitFor("the parent suspended", func() bool { return b.reg.Stats().Suspended == 1 })
	close(gate)
	if out, err := result[string](t, b.pool, h.ID); err != nil || out != "x" {
		t.Fatalf("%q %v", out, err)
	}
}

// A child that completes in its parent's slot records the parent's
// checkpoint of it with its own end: when Get returns, before the parent
// writes anything, the parent's step is already committed completed with
// the child's output (one attempt), and the parent's replay returns it.
func TestInlineChildsEndWritesItsParentsCheckpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	echo := workflow.MustRegister(b.reg, "echo", func(wctx workflow.Context, s string) (string, error) {
		return workflow.Step(wctx, "say", func(ctx context.Context) (string, error) { return "said " + s, nil }, nil)
	})
	seen := make(chan string, 4)
	parent := workflow.MustRegister(b.reg, "parent", func(wctx workflow.Context, _ int) (string, error) {
		out, err := workflow.Child(wctx, "a", echo, "a", nil).Get(wctx)
		if err != nil {
			return "", err
		}
		// Read outside any write of the parent's: what is committed now.
		var state, output string
		var attempts int
		if err := b.pool.QueryRow(ctx, `SELECT state, coalesce(output::text, ''), attempts FROM relay_workflow_steps
			WHERE run_id = 'p' AND key = 'a' AND kind = 'child'`).Scan(&state, &output, &attempts); err != nil {
			return "", err
		}
		seen <- state + " " + output + " " + strconv.Itoa(attempts)
		return out, nil
	})
	b.startWith(&core.Config{Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 1}}})
	h, err := workflow.Start(ctx, b.pool, parent, 0, &workflow.StartOpts{ID: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := result[string](t, b.pool, h.ID); err != nil || out != "said a" {
		t.Fatalf("%q %v", out, err)
	}
	if got := <-seen; got != `completed "said a" 1` {
		t.Fatalf("the parent's checkpoint of its child when Get returned: %q, want completed with the child's output, 1 attempt", got)
	}
	if st := b.reg.Stats(); st.Suspended != 0 || st.Executions != 2 {
		t.Fatalf("stats %+v: want 2 executions (the parent's and its child's in its slot), none suspended", st)
	}
	// The child's one write was its outcome, which marked it started and
	// counted its execution (no touch before it).
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'p/a' AND state = 'completed'
		AND started_at IS NOT NULL AND started_at <= finished_at AND executions = 1`); n != 1 {
		t.Fatal("the child is not completed, started and counted once")
	}
}

// A root run whose step checkpoints all wait for its end records that
// end in one update of its row: the outcome marks it started and counts
// its execution (no touch before it), as a child's does. A run whose first
// write comes earlier (a sleep) is touched by that write, and its outcome
// counts nothing more. Counted by a trigger on the runs' table.
func TestRootRunCompletesInItsFirstWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `
		CREATE TABLE run_updates (n serial, run_id text, old_state text, new_state text);
		CREATE FUNCTION count_run_update() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO run_updates (run_id, old_state, new_state) VALUES (NEW.id, OLD.state, NEW.state); RETURN NEW; END $$;
		CREATE TRIGGER count_run_update AFTER UPDATE ON relay_workflow_runs FOR EACH ROW EXECUTE FUNCTION count_run_update();`); err != nil {
		t.Fatal(err)
	}
	chain := workflow.MustRegister(b.reg, "chain", func(wctx workflow.Context, n int) (int, error) {
		// One step: its checkpoint waits for the end. (Each later step
		// would commit the one before it first: its effects may depend on
		// that output.)
		return workflow.Step(wctx, "a", func(context.Context) (int, error) { return n + 1, nil }, nil)
	})
	failing := workflow.MustRegister(b.reg, "failing", func(wctx workflow.Context, _ int) (int, error) {
		return 0, errors.New("no")
	})
	napping := workflow.MustRegister(b.reg, "napping", func(wctx workflow.Context, n int) (int, error) {
		if err := workflow.Sleep(wctx, "nap", time.Millisecond); err != nil {
			return 0, err
		}
		return n, nil
	})
	b.start()
	for _, c := range []struct {
		id    string
		start func() error
		want  string // the run's row updates, in order
		execs int
	}{
		{"chain", func() error {
			_, err := workflow.Start(ctx, b.pool, chain, 0, &workflow.StartOpts{ID: "chain"})
			return err
		},
			"pending>completed", 1},
		{"failing", func() error {
			_, err := workflow.Start(ctx, b.pool, failing, 0, &workflow.StartOpts{ID: "failing"})
			return err
		}, "pending>failed", 1},
		{"napping", func() error {
			_, err := workflow.Start(ctx, b.pool, napping, 0, &workflow.StartOpts{ID: "napping"})
			return err
		}, "pending>running running>completed", 2},
	} {
		if err := c.start(); err != nil {
			t.Fatal(err)
		}
		if _, err := result[int](t, b.pool, c.id); err != nil && c.id != "failing" {
			t.Fatalf("%s: %v", c.id, err)
		}
		var got string
		if err := b.pool.QueryRow(ctx, `SELECT coalesce(string_agg(old_state || '>' || new_state, ' ' ORDER BY n), '')
			FROM run_updates WHERE run_id = $1`, c.id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s: the run's row was updated %q, want %q", c.id, got, c.want)
		}
		if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1 AND finished_at IS NOT NULL
			AND started_at IS NOT NULL AND started_at <= finished_at AND executions = $2`, c.id, c.execs); n != 1 {
			t.Errorf("%s: the run is not finished, started and counted %d times", c.id, c.execs)
		}
	}
}
