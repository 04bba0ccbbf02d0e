package workflow_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/workflow"
)

type drawn struct {
	Now    time.Time `json:"now"`
	Random uint64    `json:"random"`
	UUID   uuid.UUID `json:"uuid"`
	Again  []string  `json:"again"`
}

// Now, Random and UUID are drawn once and replayed: the values seen after a
// suspension are those seen before it.
func TestRecordedValuesReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var execs atomic.Int32
	var first drawn
	wf := workflow.MustRegister(b.reg, "dice", func(wctx workflow.Context, _ int) (drawn, error) {
		d := drawn{Now: workflow.Now(wctx, "now"), Random: workflow.Random(wctx, "rnd"), UUID: workflow.UUID(wctx, "id")}
		if execs.Add(1) == 1 {
			first = d
		} else if !d.Now.Equal(first.Now) || d.Random != first.Random || d.UUID != first.UUID {
			d.Again = append(d.Again, "changed")
		}
		if err := workflow.Sleep(wctx, "nap", 0); err != nil {
			return d, err
		}
		return d, nil
	})
	b.start()
	h, _ := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	d, err := result[drawn](t, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if execs.Load() != 2 || len(d.Again) != 0 || d.UUID == uuid.Nil {
		t.Fatalf("execs %d, %+v", execs.Load(), d)
	}
}

// Patch: a run started on v1 and finished by v2 replays v1's path; a run
// started on v2 takes the new one.
func TestPatchV1ToV2(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var v2 atomic.Bool
	wf := workflow.MustRegister(b.reg, "notify", func(wctx workflow.Context, _ int) (string, error) {
		var via string
		var err error
		if v2.Load() && workflow.Patch(wctx, "sms") {
			via, err = workflow.Step(wctx, "sms", func(ctx context.Context) (string, error) { return "sms", nil }, nil)
		} else {
			via, err = workflow.Step(wctx, "email", func(ctx context.Context) (string, error) { return "email", nil }, nil)
		}
		if err != nil {
			return "", err
		}
		if _, _, err := workflow.WaitSignal[int](wctx, "go", 0); err != nil {
			return "", err
		}
		return via, nil
	})
	b.start()
	old, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "old"})
	b.waitFor("v1 run waiting", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'old' AND key = 'signal:go#1'`) == 1
	})
	v2.Store(true) // deploy v2 while "old" is in flight
	fresh, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "new"})
	for _, id := range []string{old.ID, fresh.ID} {
		b.waitFor("run waiting", func() bool {
			return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'signal:go#1'`, id) == 1
		})
		if err := workflow.Signal(ctx, b.pool, id, "go", 1); err != nil {
			t.Fatal(err)
		}
	}
	if via, err := result[string](t, b.pool, old.ID); err != nil || via != "email" {
		t.Fatalf("v1 run finished by v2: %q, %v", via, err)
	}
	if via, err := result[string](t, b.pool, fresh.ID); err != nil || via != "sms" {
		t.Fatalf("v2 run: %q, %v", via, err)
	}
}

// Events are visible from outside while the run runs, and ContinueAsNew
// restarts the run with fresh history.
func TestEventsAndContinueAsNew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "cycle", func(wctx workflow.Context, n int) (int, error) {
		if err := workflow.SetEvent(wctx, "cycle", n); err != nil {
			return 0, err
		}
		if _, err := workflow.Step(wctx, "work", func(ctx context.Context) (int, error) { return n, nil }, nil); err != nil {
			return 0, err
		}
		if n < 3 {
			return 0, workflow.ContinueAsNew(wctx, n+1)
		}
		if _, _, err := workflow.WaitSignal[int](wctx, "stop", 0); err != nil {
			return 0, err
		}
		return n, nil
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	b.waitFor("the fourth generation's event", func() bool {
		v, ok, err := workflow.GetEvent[int](ctx, b.pool, h.ID, "cycle")
		if err != nil {
			t.Fatal(err)
		}
		return ok && v == 3
	})
	if err := workflow.Signal(ctx, b.pool, h.ID, "stop", 0); err != nil {
		t.Fatal(err)
	}
	if out, err := result[int](t, b.pool, h.ID); err != nil || out != 3 {
		t.Fatal(out, err)
	}
	run, err := workflow.Get(ctx, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if run.Generation != 3 || len(run.Steps) != 3 { // event, work, signal of the last generation
		t.Fatalf("generation %d, %d steps: %+v", run.Generation, len(run.Steps), run.Steps)
	}
	if _, ok, _ := workflow.GetEvent[int](ctx, b.pool, h.ID, "missing"); ok {
		t.Fatal("missing event found")
	}
}

// A replay that returns while history holds steps after the point it
// returned at (a step removed from the end, a branch on something not
// recorded) is non-determinism, not a completed run.
func TestReturnBeforeHistoryEndsIsNonDeterminism(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var v2 atomic.Bool
	wf := workflow.MustRegister(b.reg, "shrunk", func(wctx workflow.Context, _ int) (int, error) {
		a, err := workflow.Step(wctx, "a", func(ctx context.Context) (int, error) { return 1, nil }, nil)
		if err != nil || v2.Load() {
			return a, err // v2: "b" and the wait were removed
		}
		if _, err := workflow.Step(wctx, "b", func(ctx context.Context) (int, error) { return 2, nil }, nil); err != nil {
			return 0, err
		}
		_, _, err = workflow.WaitSignal[int](wctx, "go", 0)
		return 3, err
	})
	b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "shrinking"})
	b.waitFor("the run waiting", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND state = 'waiting'`, h.ID) == 1
	})
	v2.Store(true)
	if err := workflow.Signal(ctx, b.pool, h.ID, "go", 1); err != nil {
		t.Fatal(err)
	}
	_, err := result[int](t, b.pool, h.ID)
	if !errors.Is(err, workflow.ErrRunFailed) {
		t.Fatalf("want a failed run, got %v", err)
	}
	for _, want := range []string{"non-determinism", "shrinking", "position 1", `"step:b"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// One patch guards several places of a workflow (as Temporal's GetVersion
// with one change id): every Patch call of that name in a run answers the
// same, the first place's answer. A run started on v1 takes the old path at
// both places; a new one the new path at both.
func TestPatchUsedAtTwoPlaces(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var v2 atomic.Bool
	step := func(wctx workflow.Context, key string) string {
		out, _ := workflow.Step(wctx, key, func(ctx context.Context) (string, error) { return key, nil }, nil)
		return out
	}
	wf := workflow.MustRegister(b.reg, "twice-patched", func(wctx workflow.Context, _ int) (string, error) {
		first := "a"
		if v2.Load() && workflow.Patch(wctx, "p") {
			first = "a2"
		}
		out := step(wctx, first)
		if _, _, err := workflow.WaitSignal[int](wctx, "go", 0); err != nil {
			return "", err
		}
		second := "b"
		if v2.Load() && workflow.Patch(wctx, "p") {
			second = "b2"
		}
		return out + "+" + step(wctx, second), nil
	})
	b.start()
	old, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "old"})
	b.waitFor("v1 run waiting", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'old' AND key = 'signal:go#1'`) == 1
	})
	v2.Store(true)
	fresh, _ := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: "new"})
	for _, id := range []string{old.ID, fresh.ID} {
		b.waitFor("run waiting", func() bool {
			return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND key = 'signal:go#1'`, id) == 1
		})
		if err := workflow.Signal(ctx, b.pool, id, "go", 1); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := result[string](t, b.pool, old.ID); err != nil || out != "a+b" {
		t.Fatalf("v1 run finished by v2: %q, %v", out, err)
	}
	if out, err := result[string](t, b.pool, fresh.ID); err != nil || out != "a2+b2" {
		t.Fatalf("v2 run: %q, %v", out, err)
	}
}

// A key given in code that starts with a prefix the package generates keys
// with is refused at the call: the run fails with ErrReservedKey naming
// the key, and the primitive does nothing.
func TestReservedKeysRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var ran atomic.Int32
	noop := func(ctx context.Context) (int, error) { ran.Add(1); return 0, nil }
	kid := workflow.MustRegister(b.reg, "kid", func(wctx workflow.Context, _ int) (int, error) { ran.Add(1); return 0, nil })
	cases := map[string]func(wctx workflow.Context) error{
		"compensate:refund": func(wctx workflow.Context) error {
			workflow.Compensate(wctx, "refund", func(ctx context.Context) error { return nil })
			_, err := workflow.Step(wctx, "compensate:refund", noop, nil)
			return err
		},
		"signal:go#1": func(wctx workflow.Context) error {
			_, err := workflow.StepTx(wctx, "signal:go#1", func(ctx context.Context, tx pgx.Tx) (int, error) { return noop(ctx) }, nil)
			return err
		},
		"patch:v2": func(wctx workflow.Context) error {
			_, err := workflow.Go(wctx, "patch:v2", noop, nil).Get(wctx)
			return err
		},
		"event:status#1": func(wctx workflow.Context) error { return workflow.Sleep(wctx, "event:status#1", 0) },
		"compensate:t":   func(wctx workflow.Context) error { workflow.Now(wctx, "compensate:t"); return nil },
		"2/kid": func(wctx workflow.Context) error {
			_, err := workflow.Child(wctx, "2/kid", kid, 0, nil).Get(wctx)
			return err
		},
	}
	ids := map[string]string{}
	for key, call := range cases {
		wf := workflow.MustRegister(b.reg, "reserved-"+key, func(wctx workflow.Context, _ int) (int, error) {
			return 0, call(wctx)
		})
		h, err := workflow.Start(ctx, b.pool, wf, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[key] = h.ID
	}
	b.start()
	for key, id := range ids {
		_, err := result[int](t, b.pool, id)
		if !errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), workflow.ErrReservedKey.Error()) || !strings.Contains(err.Error(), `"`+key+`"`) {
			t.Fatalf("key %q: want failed with ErrReservedKey naming it, got %v", key, err)
		}
		if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1`, id); n != 0 {
			t.Fatalf("key %q: %d steps recorded", key, n)
		}
	}
	if ran.Load() != 0 {
		t.Fatalf("%d refused steps or children ran", ran.Load())
	}
}
