package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// errDeclined is a sentinel the workflows of these tests branch on.
var errDeclined = errors.New("gateway: declined")

// gatewayError is an error type the workflows of these tests read.
type gatewayError struct {
	Code int `json:"code"`
}

func (e *gatewayError) Error() string { return fmt.Sprintf("gateway error %d", e.Code) }

// notDeclared is an error type no registry declares.
type notDeclared struct{}

func (notDeclared) Error() string { return "not declared" }

// sights records what each execution of a run saw of a step's error.
type sights struct {
	mu   sync.Mutex
	seen []string
}

func (s *sights) add(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = append(s.seen, v)
}

func (s *sights) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

// replayBy forces the run to replay after the failed step: by a sleep (the
// run suspends) or by a rescue (the first execution's worker dies: its
// lease expires and the rescuer gives the run to another execution).
type replayBy func(b *bundle, wctx workflow.Context, died *atomic.Int32)

var replays = map[string]replayBy{
	"sleep": func(b *bundle, wctx workflow.Context, _ *atomic.Int32) {
		if err := workflow.Sleep(wctx, "nap", time.Millisecond); err != nil {
			panic(err)
		}
	},
	"rescue": func(b *bundle, wctx workflow.Context, died *atomic.Int32) {
		workflow.Step(wctx, "die", func(ctx context.Context) (int, error) {
			if died.Add(1) == 1 {
				b.rescueNow(wctx.RunID()) // the worker dies here
				return 0, errors.New("killed")
			}
			return 0, nil
		}, nil)
	},
}

// A step's error is rebuilt from what its checkpoint stores, on the
// execution that ran the step as on every replay: errors.Is on a declared
// sentinel, errors.As on an *Error, on a declared error type, and on an
// undeclared type (never found) answer the same on each execution.
func TestStepErrorIsTheSameOnEveryExecution(t *testing.T) {
	t.Parallel()
	for name, replay := range replays {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			if err := b.reg.DeclareError("card_declined", errDeclined); err != nil {
				t.Fatal(err)
			}
			if err := workflow.DeclareErrorType[*gatewayError](b.reg, "gateway"); err != nil {
				t.Fatal(err)
			}
			var seen sights
			var died atomic.Int32
			wf := workflow.MustRegister(b.reg, "typed-errors", func(wctx workflow.Context, _ int) (string, error) {
				_, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) {
					app := &workflow.Error{Type: "card_declined", Message: "insufficient funds", Details: json.RawMessage(`{"limit":50}`)}
					return 0, core.Permanent(fmt.Errorf("gateway: %w", errors.Join(errDeclined, app, &gatewayError{Code: 51}, notDeclared{})))
				}, nil)
				var app *workflow.Error
				var ge *gatewayError
				var nd notDeclared
				var se *workflow.StepError
				sight := fmt.Sprintf("is=%v app=%v gateway=%v undeclared=%v step=%v isApp=%v",
					errors.Is(err, errDeclined),
					errors.As(err, &app) && app.Type == "card_declined" && app.Message == "insufficient funds" && string(app.Details) == `{"limit":50}`,
					errors.As(err, &ge) && ge.Code == 51,
					errors.As(err, &nd),
					errors.As(err, &se) && se.Key == "charge" && strings.Contains(se.Message, "insufficient funds"),
					errors.Is(err, &workflow.Error{Type: "card_declined"}))
				seen.add(sight)
				replay(b, wctx, &died)
				if !errors.Is(err, errDeclined) {
					return "", fmt.Errorf("a handled error was not recognised: %w", err)
				}
				return sight, nil
			})
			b.startWith(&core.Config{RescueInterval: 50 * time.Millisecond})
			h, err := workflow.Start(context.Background(), b.pool, wf, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			out, err := result[string](t, b.pool, h.ID)
			if err != nil {
				t.Fatalf("run: %v (seen %q)", err, seen.get())
			}
			want := "is=true app=true gateway=true undeclared=false step=true isApp=true"
			got := seen.get()
			if len(got) < 2 {
				t.Fatalf("the run executed %d times, want a replay", len(got))
			}
			for i, g := range got {
				if g != want {
					t.Fatalf("execution %d saw %q, want %q (all: %q)", i+1, g, want, got)
				}
			}
			if out != want {
				t.Fatalf("output %q", out)
			}
		})
	}
}

// A declared sentinel is matched by an *Error of its code, and an *Error
// marked NonRetryable ends its step at the first attempt.
func TestStepErrorTypeMatchesItsSentinelAndIsNotRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.reg.DeclareError("card_declined", errDeclined); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	wf := workflow.MustRegister(b.reg, "non-retryable", func(wctx workflow.Context, _ int) (bool, error) {
		_, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) {
			calls.Add(1)
			return 0, &workflow.Error{Type: "card_declined", NonRetryable: true}
		}, &workflow.StepOpts{MaxAttempts: 5})
		return errors.Is(err, errDeclined), nil
	})
	b.start()
	h, _ := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	if out, err := result[bool](t, b.pool, h.ID); err != nil || !out {
		t.Fatalf("want errors.Is the declared sentinel, got %v %v", out, err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the step ran %d times, want once", n)
	}
}

// Declarations are checked: an empty code, a nil sentinel, a code or
// sentinel declared twice and a built-in code are refused.
func TestDeclareErrorRefusesBadDeclarations(t *testing.T) {
	t.Parallel()
	reg := workflow.NewRegistry(nil, nil)
	if err := reg.DeclareError("declined", errDeclined); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"empty code":     reg.DeclareError("", errors.New("x")),
		"nil sentinel":   reg.DeclareError("x", nil),
		"code twice":     reg.DeclareError("declined", errors.New("other")),
		"sentinel twice": reg.DeclareError("other", errDeclined),
		"built-in code":  reg.DeclareError("relay.step_timeout", errors.New("x")),
		"type code used": workflow.DeclareErrorType[*gatewayError](reg, "declined"),
		"type no code":   workflow.DeclareErrorType[*gatewayError](reg, ""),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A failed step's stored error description that no longer decodes (written
// behind the API, or a declared type whose fields changed) fails its run on
// the replay that reads it, with the decode error, rather than let the
// workflow branch otherwise than it did.
func TestUndecodableStoredStepErrorFailsItsRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := workflow.DeclareErrorType[*gatewayError](b.reg, "gateway"); err != nil {
		t.Fatal(err)
	}
	wf := workflow.MustRegister(b.reg, "bad-error", func(wctx workflow.Context, _ int) (int, error) {
		_, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) {
			return 0, core.Permanent(&gatewayError{Code: 51})
		}, nil)
		var ge *gatewayError
		if !errors.As(err, &ge) {
			return 0, errors.New("want the gateway error")
		}
		if _, _, err := workflow.WaitSignal[int](wctx, "go", 0); err != nil {
			return 0, err
		}
		return ge.Code, nil
	})
	ctx := context.Background()
	for _, id := range []string{"bad-description", "bad-type", "good"} {
		if _, err := workflow.Start(ctx, b.pool, wf, 0, &workflow.StartOpts{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	b.start()
	b.waitFor("the runs to wait", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE kind = 'signal' AND state = 'waiting'`) == 3
	})
	b.exec(`UPDATE relay_workflow_steps SET error_info = '"text"' WHERE run_id = 'bad-description' AND key = 'charge'`)
	b.exec(`UPDATE relay_workflow_steps SET error_info = '{"types": {"gateway": "{\"code\": \"x\"}"}}' WHERE run_id = 'bad-type' AND key = 'charge'`)
	for id, want := range map[string]string{
		"bad-description": `step "charge": decode stored error description`,
		"bad-type":        `step "charge": decode stored error of declared type "gateway"`,
		"good":            "",
	} {
		if err := workflow.Signal(ctx, b.pool, id, "go", 1); err != nil {
			t.Fatal(err)
		}
		out, err := result[int](t, b.pool, id)
		switch {
		case want == "" && (err != nil || out != 51):
			t.Errorf("%s: %v %v; want 51", id, out, err)
		case want != "" && (!errors.Is(err, workflow.ErrRunFailed) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), id)):
			t.Errorf("%s: %v; want failed with %q", id, err, want)
		}
	}
}

// A run's and a step's error text are stored bounded: a 10 MB error is cut
// on a UTF-8 boundary to MaxErrorBytes, ending with a marker; NUL bytes
// (which PostgreSQL text refuses) do not stop the run from failing.
func TestErrorTextBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	huge := strings.Repeat("é", 5<<20) // 10 MiB of two-byte runes
	direct := workflow.MustRegister(b.reg, "huge-error", func(wctx workflow.Context, _ int) (int, error) {
		return 0, errors.New("x" + huge) // odd length: a cut at a fixed byte count splits a rune
	})
	inStep := workflow.MustRegister(b.reg, "huge-step-error", func(wctx workflow.Context, _ int) (int, error) {
		return workflow.Step(wctx, "s", func(ctx context.Context) (int, error) {
			return 0, core.Permanent(errors.New("nul\x00" + huge))
		}, nil)
	})
	b.start()
	check := func(what, s string) {
		t.Helper()
		if len(s) > workflow.MaxErrorBytes || !utf8.ValidString(s) || strings.ContainsRune(s, 0) ||
			!strings.HasSuffix(s, "bytes)") || !strings.Contains(s, "…(truncated, ") {
			t.Fatalf("%s: %d bytes, valid UTF-8 %v, ends %q", what, len(s), utf8.ValidString(s), s[max(0, len(s)-40):])
		}
	}
	for _, wf := range []*workflow.Workflow[int, int]{direct, inStep} {
		h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
		_, err := result[int](t, b.pool, h.ID)
		var re *workflow.RunError
		if !errors.As(err, &re) || re.State != workflow.StateFailed {
			t.Fatalf("%s: want a failed run, got %.200v", wf.Name(), err)
		}
		check(wf.Name()+": run error", re.Message)
		run, err := workflow.Get(ctx, b.pool, h.ID)
		if err != nil {
			t.Fatal(err)
		}
		check(wf.Name()+": stored run error", run.Error)
		for _, s := range run.Steps {
			check(wf.Name()+": step error", s.Error)
		}
	}
	if n := b.count(`SELECT max(octet_length(error)) FROM relay_workflow_runs`); n > workflow.MaxErrorBytes {
		t.Fatalf("a stored error has %d bytes", n)
	}
}
