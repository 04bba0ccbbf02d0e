package workflow_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// logRecorder is a slog.Handler keeping every record, with its attributes
// flattened to strings.
type logRecorder struct {
	mu   sync.Mutex
	recs []logRec
}

type logRec struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := logRec{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool { rec.attrs[a.Key] = a.Value.String(); return true })
	l.mu.Lock()
	l.recs = append(l.recs, rec)
	l.mu.Unlock()
	return nil
}

// find returns the records whose message contains msg and whose
// attributes include want.
func (l *logRecorder) find(msg string, want map[string]string) []logRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logRec
next:
	for _, r := range l.recs {
		if !strings.Contains(r.msg, msg) {
			continue
		}
		for k, v := range want {
			if r.attrs[k] != v {
				continue next
			}
		}
		out = append(out, r)
	}
	return out
}

func (l *logRecorder) dump() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range l.recs {
		b.WriteString(r.level.String() + " " + r.msg)
		for k, v := range r.attrs {
			b.WriteString(" " + k + "=" + v)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Every failed step attempt is logged at warn with its run, workflow, step
// and attempt, and so is every run that ends failed, compensated or
// cancelled; a completed run logs no warning.
func TestFailuresLogged(t *testing.T) {
	t.Parallel()
	logs := &logRecorder{}
	pool := testdb.New(t)
	reg := workflow.NewRegistry(pool, &workflow.Config{Logger: slog.New(logs),
		ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
	b := &bundle{t: t, pool: pool, reg: reg}
	fast := &workflow.StepOpts{MaxAttempts: 3, Retry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })}
	var flaky atomic.Int32
	// pay: a step that fails once, then one that fails for good; with
	// compensate the run is compensated, without it failed.
	pay := workflow.MustRegister(reg, "pay", func(wctx workflow.Context, compensate bool) (int, error) {
		if _, err := workflow.Step(wctx, "flaky", func(ctx context.Context) (int, error) {
			if flaky.Add(1) == 1 {
				return 0, errors.New("gateway timeout")
			}
			return 1, nil
		}, fast); err != nil {
			return 0, err
		}
		if compensate {
			workflow.Compensate(wctx, "refund", func(ctx context.Context) error { return nil })
		}
		return workflow.Step(wctx, "doomed", func(ctx context.Context) (int, error) {
			return 0, core.Permanent(errors.New("card declined"))
		}, fast)
	})
	wait := workflow.MustRegister(reg, "wait", func(wctx workflow.Context, _ int) (string, error) {
		if _, err := workflow.Step(wctx, "ask", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		v, _, err := workflow.WaitSignal[string](wctx, "go", time.Hour)
		return v, err
	})
	ok := workflow.MustRegister(reg, "ok", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "only", func(ctx context.Context) (int, error) { return 1, nil }, nil)
	})
	b.start()
	ctx := context.Background()
	failed, _ := workflow.Start(ctx, pool, pay, false, &workflow.StartOpts{ID: "log-failed"})
	if _, err := result[int](t, pool, failed.ID); err == nil {
		t.Fatal("run log-failed succeeded")
	}
	compensated, _ := workflow.Start(ctx, pool, pay, true, &workflow.StartOpts{ID: "log-compensated"})
	if _, err := result[int](t, pool, compensated.ID); err == nil {
		t.Fatal("run log-compensated succeeded")
	}
	cancelled, _ := workflow.Start(ctx, pool, wait, 0, &workflow.StartOpts{ID: "log-cancelled"})
	b.waitFor("the run to wait for its signal", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = 'log-cancelled' AND kind = 'signal'`) == 1
	})
	if err := workflow.Cancel(ctx, pool, cancelled.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := result[string](t, pool, cancelled.ID); err == nil {
		t.Fatal("run log-cancelled succeeded")
	}
	completed, _ := workflow.Start(ctx, pool, ok, 0, &workflow.StartOpts{ID: "log-completed"})
	if _, err := result[int](t, pool, completed.ID); err != nil {
		t.Fatal(err)
	}

	retried := logs.find("workflow step attempt failed; it will be retried", map[string]string{
		"run_id": "log-failed", "workflow": "pay", "step": "flaky", "attempt": "1", "error": "gateway timeout"})
	if len(retried) != 1 || retried[0].level != slog.LevelWarn {
		t.Errorf("the retried attempt of step flaky: %d warn lines, want 1\n%s", len(retried), logs.dump())
	}
	for _, run := range []string{"log-failed", "log-compensated"} {
		final := logs.find("workflow step attempt failed; the step failed for good", map[string]string{
			"run_id": run, "workflow": "pay", "step": "doomed", "attempt": "1"})
		if len(final) != 1 || final[0].level != slog.LevelWarn || !strings.Contains(final[0].attrs["error"], "card declined") {
			t.Errorf("run %s, step doomed: %d warn lines for its failure for good, want 1\n%s", run, len(final), logs.dump())
		}
	}
	for run, state := range map[string]string{"log-failed": "failed", "log-compensated": "compensated", "log-cancelled": "cancelled"} {
		ended := logs.find("workflow run ended "+state, map[string]string{"run_id": run, "state": state})
		if len(ended) != 1 || ended[0].level != slog.LevelWarn || ended[0].attrs["workflow"] == "" || ended[0].attrs["error"] == "" {
			t.Errorf("run %s: %d warn lines 'ended %s' naming its workflow and error, want 1\n%s", run, len(ended), state, logs.dump())
		}
	}
	if got := logs.find("", map[string]string{"run_id": "log-completed"}); len(got) != 0 {
		t.Errorf("a completed run logged %d lines, want none\n%s", len(got), logs.dump())
	}
}

// The rescuer's warning about a run's job names the run, read from the
// job's metadata (the core knows nothing else of workflows).
func TestRescueLogNamesRun(t *testing.T) {
	t.Parallel()
	logs := &logRecorder{}
	pool := testdb.New(t)
	reg := workflow.NewRegistry(pool, &workflow.Config{Logger: slog.New(logs),
		ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
	b := &bundle{t: t, pool: pool, reg: reg}
	var first atomic.Bool
	wf := workflow.MustRegister(b.reg, "stalls", func(wctx workflow.Context, _ int) (string, error) {
		return workflow.Step(wctx, "confirm", func(ctx context.Context) (string, error) {
			if first.CompareAndSwap(false, true) {
				b.rescueNow(wctx.RunID()) // the worker is presumed dead
			}
			return "ok", nil
		}, nil)
	})
	b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond, Logger: slog.New(logs)})
	h, err := workflow.Start(context.Background(), b.pool, wf, 0, &workflow.StartOpts{ID: "rescued-run"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := result[string](t, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	if got := logs.find("rescued job whose lease expired", map[string]string{"run_id": "rescued-run", "kind": workflow.RunKind}); len(got) == 0 {
		t.Errorf("no rescue warning names run rescued-run\n%s", logs.dump())
	}
	for _, r := range logs.find("relay: ", nil) {
		if r.attrs["job_id"] != "" && r.attrs["run_id"] != "rescued-run" {
			t.Errorf("a line about the run's job does not name the run: %s %v", r.msg, r.attrs)
		}
	}
}

// Each execution's span carries its number: a run that sleeps has two
// executions, numbered 1 and 2 (the core's attempt is 1 for both, since a
// suspension is not an attempt).
func TestExecutionSpanNumbered(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	pool := testdb.New(t)
	reg := workflow.NewRegistry(pool, &workflow.Config{TracerProvider: tp,
		ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
	b := &bundle{t: t, pool: pool, reg: reg}
	wf := workflow.MustRegister(reg, "naps", func(wctx workflow.Context, _ int) (int, error) {
		if _, err := workflow.Step(wctx, "before", func(ctx context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		if err := workflow.Sleep(wctx, "nap", 10*time.Millisecond); err != nil {
			return 0, err
		}
		return workflow.Step(wctx, "after", func(ctx context.Context) (int, error) { return 2, nil }, nil)
	})
	b.start()
	h, _ := workflow.Start(context.Background(), pool, wf, 0, nil)
	if _, err := result[int](t, pool, h.ID); err != nil {
		t.Fatal(err)
	}
	// The run's outcome commits inside its last execution, whose span ends
	// only after: wait (bounded) for both executions' spans to end.
	executionNumbers := func() []int64 {
		var numbers []int64
		for _, s := range rec.Ended() {
			if !strings.HasPrefix(s.Name(), "workflow.execute") {
				continue
			}
			for _, a := range s.Attributes() {
				if a.Key == attribute.Key("relay.workflow.execution") {
					numbers = append(numbers, a.Value.AsInt64())
				}
			}
		}
		return numbers
	}
	b.waitFor("both execute spans to end", func() bool { return len(executionNumbers()) >= 2 })
	numbers := executionNumbers()
	if len(numbers) != 2 || numbers[0] != 1 || numbers[1] != 2 {
		t.Fatalf("execution numbers on the execute spans: %v, want [1 2]", numbers)
	}
}

// Value and child steps run no function: their attempt log is empty (no
// attempt dated 0001-01-01), while a step's holds its real attempt.
func TestAttemptLogOnlyRealAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	child := workflow.MustRegister(b.reg, "leaf", func(wctx workflow.Context, _ int) (int, error) { return 7, nil })
	wf := workflow.MustRegister(b.reg, "tree", func(wctx workflow.Context, _ int) (int, error) {
		_ = workflow.UUID(wctx, "token")
		n, err := workflow.Child(wctx, "leaf", child, 0, nil).Get(wctx)
		if err != nil {
			return 0, err
		}
		return workflow.Step(wctx, "sum", func(ctx context.Context) (int, error) { return n + 1, nil }, nil)
	})
	b.start()
	h, _ := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	if _, err := result[int](t, b.pool, h.ID); err != nil {
		t.Fatal(err)
	}
	// As stored: no null entries.
	if n := b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND attempt_log @> '[null]'`, h.ID); n != 0 {
		t.Errorf("%d steps hold a null attempt in their stored log", n)
	}
	run, err := workflow.Get(context.Background(), b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range run.Steps {
		switch s.Kind {
		case "value", "child":
			if len(s.AttemptLog) != 0 {
				t.Errorf("%s step %q: attempt log %+v, want empty", s.Kind, s.Key, s.AttemptLog)
			}
		case "step":
			if len(s.AttemptLog) != 1 || s.AttemptLog[0].Attempt != 1 || s.AttemptLog[0].StartedAt.Year() < 2000 {
				t.Errorf("step %q: attempt log %+v, want one dated attempt", s.Key, s.AttemptLog)
			}
		}
	}
}

// A start job put back because this process does not know its workflow
// names the run it is to start.
func TestUnregisteredStartLogNamesRun(t *testing.T) {
	t.Parallel()
	logs := &logRecorder{}
	pool := testdb.New(t)
	reg := workflow.NewRegistry(pool, &workflow.Config{Logger: slog.New(logs)})
	b := &bundle{t: t, pool: pool, reg: reg}
	b.start()
	if _, err := core.Enqueue(context.Background(), pool, workflow.StartArgs{Workflow: "nope", ID: "nope-1"}, nil); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the start job's warning", func() bool {
		return len(logs.find("start job of a workflow not registered", map[string]string{"run_id": "nope-1", "workflow": "nope"})) == 1
	})
}
