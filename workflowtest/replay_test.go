package workflowtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
	"github.com/relayq/relay/workflowtest"
)

// The three versions of a workflow: v1 as recorded, v2 with two steps
// swapped, v3 the same change behind a Patch.
func orderV1(wctx workflow.Context, in string) (string, error) {
	a, _ := workflow.Step(wctx, "reserve", func(ctx context.Context) (string, error) { return "r-" + in, nil }, nil)
	if err := workflow.Sleep(wctx, "cool-off", 48*time.Hour); err != nil {
		return "", err
	}
	b, _ := workflow.Step(wctx, "charge", func(ctx context.Context) (string, error) { return "c-" + in, nil }, nil)
	c, _ := workflow.Step(wctx, "email", func(ctx context.Context) (string, error) { return "e-" + in, nil }, nil)
	return a + b + c, nil
}

func orderV2(wctx workflow.Context, in string) (string, error) {
	a, _ := workflow.Step(wctx, "reserve", func(ctx context.Context) (string, error) { return "r-" + in, nil }, nil)
	if err := workflow.Sleep(wctx, "cool-off", 48*time.Hour); err != nil {
		return "", err
	}
	c, _ := workflow.Step(wctx, "email", func(ctx context.Context) (string, error) { return "e-" + in, nil }, nil)
	b, _ := workflow.Step(wctx, "charge", func(ctx context.Context) (string, error) { return "c-" + in, nil }, nil)
	return a + b + c, nil
}

func orderV3(wctx workflow.Context, in string) (string, error) {
	a, _ := workflow.Step(wctx, "reserve", func(ctx context.Context) (string, error) { return "r-" + in, nil }, nil)
	if err := workflow.Sleep(wctx, "cool-off", 48*time.Hour); err != nil {
		return "", err
	}
	var b, c string
	if workflow.Patch(wctx, "email-first") {
		c, _ = workflow.Step(wctx, "email", func(ctx context.Context) (string, error) { return "e-" + in, nil }, nil)
		b, _ = workflow.Step(wctx, "charge", func(ctx context.Context) (string, error) { return "c-" + in, nil }, nil)
	} else {
		b, _ = workflow.Step(wctx, "charge", func(ctx context.Context) (string, error) { return "c-" + in, nil }, nil)
		c, _ = workflow.Step(wctx, "email", func(ctx context.Context) (string, error) { return "e-" + in, nil }, nil)
	}
	return a + b + c, nil
}

func registryOf(t *testing.T, fn func(workflow.Context, string) (string, error)) *workflow.Registry {
	t.Helper()
	reg := workflow.NewRegistry(nil, nil) // a replay needs no database
	workflow.MustRegister(reg, "order", fn)
	return reg
}

// record runs v1 twice in a test environment and returns the histories,
// through their JSON export.
func record(t *testing.T) []*workflow.History {
	t.Helper()
	env := workflowtest.New(t, testdb.URL(t), nil)
	wf := workflow.MustRegister(env.Registry(), "order", orderV1)
	var buf bytes.Buffer
	for _, id := range []string{"o1", "o2"} {
		if _, run := workflowtest.Run(env, wf, id, &workflow.StartOpts{ID: id}); run.State != workflow.StateCompleted {
			t.Fatalf("run %s %s: %s", id, run.State, run.Error)
		}
		if err := json.NewEncoder(&buf).Encode(env.History(id)); err != nil {
			t.Fatal(err)
		}
	}
	hs, err := workflow.DecodeHistories(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

// Recorded histories replay on the code that recorded them; a reordered
// step fails the replay with the run, the position and both keys; the same
// change behind Patch replays again.
func TestReplayReorderedStepFailsUntilPatched(t *testing.T) {
	hs := record(t)
	if len(hs) != 2 || hs[0].Format != workflow.HistoryFormat || hs[0].StepCount != 4 {
		t.Fatalf("histories: %d, first %+v", len(hs), hs[0])
	}
	if err := workflow.Replay(context.Background(), registryOf(t, orderV1), hs...); err != nil {
		t.Fatalf("v1 on its own histories: %v", err)
	}
	err := workflow.Replay(context.Background(), registryOf(t, orderV2), hs...)
	var re *workflow.ReplayError
	var nd *workflow.NonDeterminismError
	if !errors.As(err, &re) || !errors.As(err, &nd) {
		t.Fatalf("v2 (reordered): %v, want a *ReplayError of non-determinism", err)
	}
	if re.RunID != "o1" || nd.Position != 2 || nd.HistoryKey != "step:charge" || nd.CodeKey != "step:email" {
		t.Fatalf("v2: run %s position %d history %q code %q", re.RunID, nd.Position, nd.HistoryKey, nd.CodeKey)
	}
	if !strings.Contains(err.Error(), "o2") {
		t.Fatalf("v2: %v, want both runs reported", err)
	}
	if err := workflow.Replay(context.Background(), registryOf(t, orderV3), hs...); err != nil {
		t.Fatalf("v3 (patched): %v", err)
	}
}

// A run in flight (waiting out its sleep) replays up to where it is: the
// reorder after the sleep does not concern it yet, a renamed first step
// does.
func TestReplayRunInFlight(t *testing.T) {
	env := workflowtest.New(t, testdb.URL(t), nil)
	wf := workflow.MustRegister(env.Registry(), "order", orderV1)
	if _, err := workflow.Start(context.Background(), env.Pool(), wf, "x", &workflow.StartOpts{ID: "in-flight"}); err != nil {
		t.Fatal(err)
	}
	env.Settle()
	h := env.History("in-flight")
	if h.Run.State != workflow.StateRunning || h.StepCount != 2 || h.Steps[1].State != "waiting" {
		t.Fatalf("history of the run in flight: %+v", h)
	}
	if err := workflow.Replay(context.Background(), registryOf(t, orderV2), h); err != nil {
		t.Fatalf("v2 on a run still sleeping: %v", err)
	}
	renamed := func(wctx workflow.Context, in string) (string, error) {
		workflow.Step(wctx, "hold", func(ctx context.Context) (string, error) { return "", nil }, nil) //nolint:errcheck
		return "", nil
	}
	var nd *workflow.NonDeterminismError
	if err := workflow.Replay(context.Background(), registryOf(t, renamed), h); !errors.As(err, &nd) || nd.Position != 0 {
		t.Fatalf("a renamed first step: %v, want non-determinism at position 0", err)
	}
}

// A history of another workflow, of an unknown format version or
// truncated is refused with an error naming what is wrong.
func TestReplayBadHistories(t *testing.T) {
	hs := record(t)
	ctx := context.Background()
	other := workflow.NewRegistry(nil, nil)
	workflow.MustRegister(other, "invoice", orderV1)
	if err := workflow.Replay(ctx, other, hs[0]); !errors.Is(err, workflow.ErrBadHistory) || !strings.Contains(err.Error(), `workflow "order"`) {
		t.Fatalf("another workflow's history: %v", err)
	}
	future := *hs[0]
	future.Format = 99
	if err := workflow.Replay(ctx, registryOf(t, orderV1), &future); !errors.Is(err, workflow.ErrBadHistory) || !strings.Contains(err.Error(), "format version 99") {
		t.Fatalf("format 99: %v", err)
	}
	cut := *hs[0]
	cut.Steps = cut.Steps[:2]
	if err := workflow.Replay(ctx, registryOf(t, orderV1), &cut); !errors.Is(err, workflow.ErrBadHistory) || !strings.Contains(err.Error(), "truncated: 2 steps of the 4") {
		t.Fatalf("two steps of four: %v", err)
	}
	b, err := json.Marshal(hs[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := workflow.DecodeHistories(bytes.NewReader(b[:len(b)/2])); !errors.Is(err, workflow.ErrBadHistory) || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("half a JSON document: %v", err)
	}
	if _, err := workflow.DecodeHistories(strings.NewReader(`{"run": {"id": "x"}}`)); !errors.Is(err, workflow.ErrBadHistory) || !strings.Contains(err.Error(), "no format version") {
		t.Fatalf("no format: %v", err)
	}
}

// Every primitive replays from an exported history without running or
// writing anything: values, parallel steps, a select on a signal, a
// signal wait, a child, an event, a patch, a failed step handled, and the
// compensations of a run that failed after them.
func TestReplayEveryPrimitive(t *testing.T) {
	env := workflowtest.New(t, testdb.URL(t), nil)
	calls := 0
	child := func(reg *workflow.Registry) *workflow.Workflow[string, string] {
		return workflow.MustRegister(reg, "child", func(wctx workflow.Context, in string) (string, error) { return "child " + in, nil })
	}
	flow := func(kid *workflow.Workflow[string, string], compensate bool) func(workflow.Context, string) (string, error) {
		return func(wctx workflow.Context, in string) (string, error) {
			calls++
			workflow.Now(wctx, "now")
			workflow.UUID(wctx, "key")
			workflow.Random(wctx, "dice")
			a := workflow.Go(wctx, "left", func(ctx context.Context) (int, error) { return 1, nil }, nil)
			b := workflow.Go(wctx, "right", func(ctx context.Context) (int, error) { return 2, nil }, nil)
			if _, err := a.Get(wctx); err != nil {
				return "", err
			}
			if _, err := b.Get(wctx); err != nil {
				return "", err
			}
			if _, err := workflow.Select(wctx, "await", workflow.OnSignal[string]("go"), workflow.OnTimer(time.Hour)); err != nil {
				return "", err
			}
			if _, _, err := workflow.WaitSignal[int](wctx, "amount", time.Hour); err != nil {
				return "", err
			}
			out, err := workflow.Child(wctx, "kid", kid, in, nil).Get(wctx)
			if err != nil {
				return "", err
			}
			if err := workflow.SetEvent(wctx, "status", out); err != nil {
				return "", err
			}
			workflow.Patch(wctx, "v2")
			if _, err := workflow.Step(wctx, "flaky", func(ctx context.Context) (int, error) {
				return 0, errors.New("always")
			}, &workflow.StepOpts{MaxAttempts: 2}); err == nil {
				return "", errors.New("flaky succeeded")
			}
			if _, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
				return "", err
			}
			if compensate {
				workflow.Compensate(wctx, "refund", func(ctx context.Context) error { return nil })
			}
			return "", errors.New("the order is void")
		}
	}
	wf := workflow.MustRegister(env.Registry(), "every", flow(child(env.Registry()), true))
	env.SignalAfter(time.Minute, "e1", "go", "now")
	env.SignalAfter(2*time.Minute, "e1", "amount", 7)
	if _, run := workflowtest.Run(env, wf, "x", &workflow.StartOpts{ID: "e1"}); run.State != workflow.StateCompensated {
		t.Fatalf("run %s: %s", run.State, run.Error)
	}
	h := env.History("e1")
	reg := workflow.NewRegistry(nil, nil)
	workflow.MustRegister(reg, "every", flow(child(reg), true))
	calls = 0
	if err := workflow.Replay(context.Background(), reg, h); err != nil {
		t.Fatalf("replay: %v\n%+v", err, h.Steps)
	}
	if calls != 1 {
		t.Fatalf("the function was called %d times by the replay, want 1", calls)
	}
	if last := h.Steps[len(h.Steps)-1]; last.Key != "compensate:refund" {
		t.Fatalf("the history ends with %s, want the compensation", last.Key)
	}
	// The compensation dropped from the code: the replay says so, at the
	// position history holds it.
	dropped := workflow.NewRegistry(nil, nil)
	workflow.MustRegister(dropped, "every", flow(child(dropped), false))
	var nd *workflow.NonDeterminismError
	if err := workflow.Replay(context.Background(), dropped, h); !errors.As(err, &nd) || nd.HistoryKey != "step:compensate:refund" || nd.CodeKey != "(return)" {
		t.Fatalf("the compensation dropped: %v", err)
	}
}
