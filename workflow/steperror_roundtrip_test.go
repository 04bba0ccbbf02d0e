package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// wrappingError is a declared error type of the common shape: a code and
// the error it wraps. Its Err does not decode from JSON (an interface).
type wrappingError struct {
	Code int
	Err  error
}

func (e *wrappingError) Error() string { return fmt.Sprintf("wrapping %d: %v", e.Code, e.Err) }
func (e *wrappingError) Unwrap() error { return e.Err }

// hiddenError has an unexported field, which JSON does not carry.
type hiddenError struct {
	Code   int
	reason string
}

func (e *hiddenError) Error() string { return fmt.Sprintf("hidden %d %s", e.Code, e.reason) }

// valueError has a value receiver: it is declared, returned and matched
// as a value.
type valueError struct{ Code int }

func (e valueError) Error() string { return fmt.Sprintf("value %d", e.Code) }

// temporary is an interface a workflow might want to read with errors.As.
type temporary interface {
	error
	Temporary() bool
}

// Declared error types that do not round-trip as JSON answer the same on
// every execution, and say so: an interface type is refused when
// declared (it can never decode); a type whose field does not decode (an
// error it wraps) is found by no execution, the first included, and a
// warning names the run, the step and the code; an unexported field comes
// back zero on every execution; a value type is found as a value; an
// *Error without Details has none on every execution.
func TestDeclaredErrorTypesThatDoNotRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := &logRecorder{}
	b.reg = workflow.NewRegistry(b.pool, &workflow.Config{
		Logger:         slog.New(logs),
		ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 }),
	})
	if err := workflow.DeclareErrorType[temporary](b.reg, "temporary"); err == nil || !strings.Contains(err.Error(), "interface") {
		t.Fatalf("an interface type declared: %v, want refused", err)
	}
	for code, declare := range map[string]func() error{
		"wrapping": func() error { return workflow.DeclareErrorType[*wrappingError](b.reg, "wrapping") },
		"hidden":   func() error { return workflow.DeclareErrorType[*hiddenError](b.reg, "hidden") },
		"value":    func() error { return workflow.DeclareErrorType[valueError](b.reg, "value") },
	} {
		if err := declare(); err != nil {
			t.Fatalf("declare %s: %v", code, err)
		}
	}
	var seen sights
	wf := workflow.MustRegister(b.reg, "round-trips", func(wctx workflow.Context, _ int) (string, error) {
		fail := func(key string, err error) error {
			_, serr := workflow.Step(wctx, key, func(ctx context.Context) (int, error) { return 0, core.Permanent(err) }, nil)
			return serr
		}
		var we *wrappingError
		var he *hiddenError
		var ve valueError
		var app *workflow.Error
		e1 := fail("wrapping", &wrappingError{Code: 7, Err: errDeclined})
		e2 := fail("hidden", &hiddenError{Code: 8, reason: "gone"})
		e3 := fail("value", fmt.Errorf("wrapped: %w", valueError{Code: 9}))
		e4 := fail("no-details", &workflow.Error{Type: "t"})
		sight := fmt.Sprintf("wrapping=%v hidden=%v value=%v details=%v",
			errors.As(e1, &we),
			errors.As(e2, &he) && he.Code == 8 && he.reason == "",
			errors.As(e3, &ve) && ve.Code == 9,
			errors.As(e4, &app) && app.Type == "t" && app.Details == nil)
		seen.add(sight)
		if err := workflow.Sleep(wctx, "nap", time.Millisecond); err != nil {
			return "", err
		}
		return sight, nil
	})
	b.start()
	h, _ := workflow.Start(context.Background(), b.pool, wf, 0, nil)
	out, err := result[string](t, b.pool, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := "wrapping=false hidden=true value=true details=true"
	for i, g := range seen.get() {
		if g != want {
			t.Fatalf("execution %d saw %q, want %q (all %q)", i+1, g, want, seen.get())
		}
	}
	if out != want || len(seen.get()) < 2 {
		t.Fatalf("output %q after %d executions", out, len(seen.get()))
	}
	if n := len(logs.find("relay: workflow step error holds a declared error type that does not round-trip as JSON; errors.As finds none of it", map[string]string{"run_id": h.ID, "step": "wrapping", "code": "wrapping"})); n != 1 {
		t.Fatalf("%d warnings for the type that does not round-trip, want 1:\n%s", n, logs.dump())
	}
}

// An error type declared after a run stored its step's error (a deploy
// that adds DeclareErrorType while the run waits) is not found on the
// replay either: the replay answers as the first execution did, and the
// run goes on.
func TestErrorTypeDeclaredAfterTheRunStoredItsError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var seen sights
	register := func(reg *workflow.Registry) *workflow.Workflow[int, bool] {
		return workflow.MustRegister(reg, "late-declaration", func(wctx workflow.Context, _ int) (bool, error) {
			_, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) {
				return 0, core.Permanent(&gatewayError{Code: 51})
			}, nil)
			var ge *gatewayError
			found := errors.As(err, &ge)
			seen.add(fmt.Sprint(found))
			if _, _, err := workflow.WaitSignal[int](wctx, "go", 0); err != nil {
				return false, err
			}
			return found, nil
		})
	}
	wf := register(b.reg)
	first := b.start()
	h, _ := workflow.Start(ctx, b.pool, wf, 0, nil)
	b.waitFor("the run waits", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_steps WHERE run_id = $1 AND state = 'waiting'`, h.ID) == 1
	})
	stop, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	first.Stop(stop)
	// The new deploy declares the type.
	b.reg = workflow.NewRegistry(b.pool, &workflow.Config{ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 })})
	if err := workflow.DeclareErrorType[*gatewayError](b.reg, "gateway"); err != nil {
		t.Fatal(err)
	}
	register(b.reg)
	b.start()
	if err := workflow.Signal(ctx, b.pool, h.ID, "go", 1); err != nil {
		t.Fatal(err)
	}
	out, err := result[bool](t, b.pool, h.ID)
	if err != nil || out {
		t.Fatalf("the run ended %v, %v; want it completed, the type not found", out, err)
	}
	if got := seen.get(); len(got) != 2 || got[0] != "false" || got[1] != "false" {
		t.Fatalf("the executions saw %v, want false on both", got)
	}
}
