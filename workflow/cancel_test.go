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

// gate holds a step's function until the test opens it, and tells the
// test when the function is inside.
type gate struct {
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{entered: make(chan struct{}), open: make(chan struct{})} }

// pass is called by the step: the first call waits for the test.
func (g *gate) pass() {
	first := false
	g.once.Do(func() { first = true })
	if !first {
		return
	}
	close(g.entered)
	select {
	case <-g.open:
	case <-time.After(time.Minute):
	}
}

func (g *gate) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the step never started")
	}
}

// A Cancel that returned nil while a step ran (the first, a middle or the
// last; inline or StepTx) ends the run cancelled, with its compensations
// run, and no step after the one running starts.
func TestCancelDuringAStepIsNeverLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		at   int  // the step that is running when Cancel returns
		asTx bool // the steps are StepTx
	}{
		{"first", 0, false},
		{"middle", 1, false},
		{"last", 2, false},
		{"first tx", 0, true},
		{"middle tx", 1, true},
		{"last tx", 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			g := newGate()
			var mu sync.Mutex
			var ran, undone []string
			note := func(list *[]string, s string) { mu.Lock(); *list = append(*list, s); mu.Unlock() }
			wf := workflow.MustRegister(b.reg, "three", func(wctx workflow.Context, _ int) (string, error) {
				out := ""
				for i := range 3 {
					key := fmt.Sprintf("s%d", i)
					body := func() string {
						note(&ran, key)
						if i == tc.at {
							g.pass()
						}
						return key
					}
					var s string
					var err error
					if tc.asTx {
						s, err = workflow.StepTx(wctx, key, func(ctx context.Context, tx pgx.Tx) (string, error) { return body(), nil }, nil)
					} else {
						s, err = workflow.Step(wctx, key, func(ctx context.Context) (string, error) { return body(), nil }, nil)
					}
					if err != nil {
						return "", err
					}
					out += s
					if i < 2 {
						workflow.Compensate(wctx, "undo-"+key, func(ctx context.Context) error { note(&undone, key); return nil })
					}
				}
				return out, nil
			})
			b.start()
			h, err := workflow.Start(ctx, b.pool, wf, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			g.waitEntered(t)
			// An execution's first write holds the run's row until it
			// commits (a StepTx first of all: "first tx"), and Cancel
			// waits for it: Cancel runs alongside, and the step is let go
			// once Cancel returned or waits for that row.
			cancelled := make(chan error, 1)
			go func() { cancelled <- workflow.Cancel(ctx, b.pool, h.ID) }()
			var cerr error
			returned := false
			b.waitFor("Cancel returned or waits for the run's row", func() bool {
				select {
				case cerr = <-cancelled:
					returned = true
					return true
				default:
				}
				return b.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'SELECT relay_workflow_cancel_tree%'`) > 0
			})
			close(g.open)
			if !returned {
				select {
				case cerr = <-cancelled:
				case <-time.After(30 * time.Second):
					t.Fatal("Cancel did not return")
				}
			}
			if !returned && errors.Is(cerr, workflow.ErrRunFinished) && strings.Contains(cerr.Error(), "completed") {
				// Cancel waited for the step, and the rest of the run (its
				// completion included) committed before Cancel's turn came:
				// it says so, and the output stands.
				if out, err := result[string](t, b.pool, h.ID); err != nil || out != "s0s1s2" {
					t.Fatalf("Cancel said the run completed; it ended with %q, %v", out, err)
				}
				return
			}
			if cerr != nil {
				t.Fatal(cerr)
			}
			out, err := result[string](t, b.pool, h.ID)
			if !errors.Is(err, workflow.ErrRunCancelled) {
				t.Fatalf("Cancel returned nil during step %d, yet the run ended with %q, %v", tc.at, out, err)
			}
			mu.Lock()
			defer mu.Unlock()
			// When Cancel waited for the step's end, it met the steps
			// after it concurrently: which of them started first is not
			// the test's to say, only that the run ended cancelled.
			if returned && len(ran) != tc.at+1 {
				t.Fatalf("steps that ran: %v; want none after s%d", ran, tc.at)
			}
			// Each step that ran completed, and registered its undo
			// unless it is the last (which has none).
			want := min(len(ran), 2)
			if len(undone) != want {
				t.Fatalf("compensations run: %v, want %d", undone, want)
			}
			if err := workflow.Cancel(ctx, b.pool, h.ID); !errors.Is(err, workflow.ErrRunFinished) || !strings.Contains(err.Error(), "cancelled") {
				t.Fatalf("cancel of the cancelled run: %v", err)
			}
		})
	}
}

// A Cancel of a run suspended in a sleep, a signal wait or a child wait
// ends it cancelled with its compensation run.
func TestCancelWhileSuspended(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"sleep", "signal", "child"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			var mu sync.Mutex
			undone := 0
			nap := workflow.MustRegister(b.reg, "nap", func(wctx workflow.Context, _ int) (int, error) {
				return 0, workflow.Sleep(wctx, "long", time.Hour)
			})
			wf := workflow.MustRegister(b.reg, "waits", func(wctx workflow.Context, _ int) (int, error) {
				if _, err := workflow.Step(wctx, "do", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
					return 0, err
				}
				workflow.Compensate(wctx, "undo", func(ctx context.Context) error { mu.Lock(); undone++; mu.Unlock(); return nil })
				switch where {
				case "sleep":
					if err := workflow.Sleep(wctx, "nap", time.Hour); err != nil {
						return 0, err
					}
				case "signal":
					if _, _, err := workflow.WaitSignal[int](wctx, "go", 0); err != nil {
						return 0, err
					}
				case "child":
					if _, err := workflow.Child(wctx, "nap", nap, 0, nil).Get(wctx); err != nil {
						return 0, err
					}
				}
				return workflow.Step(wctx, "after", func(ctx context.Context) (int, error) { return 2, nil }, nil)
			})
			b.start()
			h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
			b.waitFor("the run suspended", func() bool {
				return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND state = 'waiting'`, h.ID) == 1
			})
			if err := workflow.Cancel(ctx, b.pool, h.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunCancelled) {
				t.Fatalf("want cancelled, got %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if undone != 1 {
				t.Fatalf("compensation ran %d times", undone)
			}
			if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'after'`, h.ID); n != 0 {
				t.Fatal("the step after the wait ran")
			}
		})
	}
}

// Cancel of a run whose completion committed says so; the run stays
// completed with its output.
func TestCancelAfterCompletionSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "quick", func(wctx workflow.Context, n int) (int, error) { return n + 1, nil })
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 1, nil)
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 2 {
		t.Fatal(out, err)
	}
	err := workflow.Cancel(ctx, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunFinished) || !strings.Contains(err.Error(), "completed") {
		t.Fatalf("cancel after completion: %v", err)
	}
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 2 {
		t.Fatal(out, err)
	}
}

// The database refuses to record a run completed while a cancel is
// requested, whoever writes it.
func TestCompletedRefusedWhileCancelRequested(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `INSERT INTO relay_workflow_runs (id, workflow, input, queue) VALUES ('r', 'w', 'null', 'default')`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE relay_workflow_runs SET state = 'running', cancel_requested = true WHERE id = 'r'`); err != nil {
		t.Fatal(err)
	}
	_, err := b.pool.Exec(ctx, `UPDATE relay_workflow_runs SET state = 'completed', output = '1', finished_at = now() WHERE id = 'r'`)
	if err == nil || !strings.Contains(err.Error(), "cancel") {
		t.Fatalf("completed over a requested cancel: %v", err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE relay_workflow_runs SET state = 'cancelled', error = 'cancelled', finished_at = now() WHERE id = 'r'`); err != nil {
		t.Fatal(err)
	}
}

// A cancel that commits while the parent is about to start a child (after
// the parent last read the cancel flag) still cancels that child: a
// cancelled run leaves no child running.
func TestCancelRacingChildStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sleeper := workflow.MustRegister(b.reg, "sleeper", func(wctx workflow.Context, _ int) (int, error) {
		_, _, err := workflow.WaitSignal[int](wctx, "never", 0)
		return 0, err
	})
	gate := make(chan struct{})
	entered := make(chan struct{})
	wf := workflow.MustRegister(b.reg, "racing-parent", func(wctx workflow.Context, _ int) (int, error) {
		if _, err := workflow.Step(wctx, "gate", func(ctx context.Context) (int, error) {
			close(entered)
			<-gate
			return 0, nil
		}, nil); err != nil {
			return 0, err
		}
		return workflow.Child(wctx, "kid", sleeper, 0, nil).Get(wctx)
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "p"})
	<-entered
	if err := workflow.Cancel(ctx, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	close(gate)
	if _, err := result[int](t, b.pool, h.ID); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("parent: want cancelled, got %v", err)
	}
	if _, err := result[int](t, b.pool, "p/kid"); !errors.Is(err, workflow.ErrRunCancelled) {
		t.Fatalf("child: want cancelled, got %v", err)
	}
}
