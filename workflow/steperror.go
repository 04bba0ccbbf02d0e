package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// Error is a step error with a stable identity, Relay's counterpart of
// Temporal's ApplicationError: a step returns one (or an error wrapping
// one), and the workflow branches on it with errors.As (to read Type and
// Details) or errors.Is (against an *Error of the same Type, or a sentinel
// declared under that Type with DeclareError). It is stored with the
// step, so the workflow sees the same *Error on the execution that ran the
// step and on every replay.
type Error struct {
	// Type is the stable code the workflow branches on ("card_declined").
	Type string
	// Message says what failed.
	Message string
	// Details is optional data for the workflow, as JSON (at most
	// MaxErrorBytes; larger or invalid details are dropped, with a note
	// in Message).
	Details json.RawMessage
	// NonRetryable ends the step at this attempt, as core.Permanent does.
	NonRetryable bool
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "workflow: error " + e.Type
	}
	return e.Type + ": " + e.Message
}

// Is reports whether target is an *Error of the same, non-empty, Type.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Type != "" && t.Type == e.Type
}

// ErrStepTimeout is matched (errors.Is) by the error of a step attempt that
// ran past StepOpts.Timeout, on every execution; so is
// context.DeadlineExceeded.
var ErrStepTimeout = errors.New("workflow: step attempt timed out")

// builtinPrefix starts the codes of the errors every registry declares
// (builtinErrors); DeclareError refuses it.
const builtinPrefix = "relay."

// builtinErrors are declared in every registry: ErrStepTimeout and the
// context package's errors, which steps commonly return.
func builtinErrors() []declaredError {
	return []declaredError{
		{code: "relay.step_timeout", sentinel: ErrStepTimeout},
		{code: "relay.heartbeat_timeout", sentinel: ErrHeartbeatTimeout},
		{code: "relay.deadline_exceeded", sentinel: context.DeadlineExceeded},
		{code: "relay.canceled", sentinel: context.Canceled},
	}
}

// declaredError is a sentinel declared with DeclareError.
type declaredError struct {
	code     string
	sentinel error
}

// declaredType is an error type declared with DeclareErrorType: match finds
// one in an error's chain and encodes it, build decodes it.
type declaredType struct {
	code string
	// match reports whether err holds an E; v is its encoding, or nil
	// with why when it does not round-trip (and is not stored).
	match func(err error) (v json.RawMessage, held bool, why error)
	build func(v json.RawMessage) (error, error)
}

// DeclareError declares sentinel as an error the registry's workflows
// branch on with errors.Is, under a stable code: a step's error that
// matches sentinel (errors.Is), or is an *Error whose Type is code, is
// stored with the code, and the workflow's errors.Is(err, sentinel) is
// true on the execution that ran the step and on every replay, in any
// process that declared the same code. The code is stored: keep it when
// the Go variable is renamed. Declare every error before the client
// starts, as Register. An empty code, a nil sentinel or a code or sentinel
// declared twice is an error.
func (r *Registry) DeclareError(code string, sentinel error) error {
	if code == "" || sentinel == nil {
		return fmt.Errorf("workflow: declare error: code %q and sentinel %v must both be given", code, sentinel)
	}
	if err := r.declarable(code); err != nil {
		return err
	}
	for _, d := range r.errs {
		if d.sentinel == sentinel {
			return fmt.Errorf("workflow: declare error %q: that sentinel is already declared as %q", code, d.code)
		}
	}
	r.errs = append(r.errs, declaredError{code: code, sentinel: sentinel})
	return nil
}

// DeclareErrorType declares E, an error type encodable as JSON (typically
// a pointer to a struct with exported fields), as one the registry's
// workflows read with errors.As, under a stable code: a step's error
// holding an E (errors.As) is stored with it encoded, and the workflow's
// errors.As(err, &e) finds an E decoded from that, with the same fields,
// on the execution that ran the step and on every replay. A value that
// does not encode, or does not decode back, within MaxErrorBytes is not
// stored (found on neither). Types not declared are not found by errors.As
// on either: only the step's message, its *Error and its declared errors
// reach the workflow.
func DeclareErrorType[E error](r *Registry, code string) error {
	if r == nil || code == "" {
		return errors.New("workflow: declare error type: a registry and a code must be given")
	}
	if t := reflect.TypeFor[E](); t.Kind() == reflect.Interface {
		// JSON cannot decode into an interface that is not empty: such a
		// declaration would never be stored, silently.
		return fmt.Errorf("workflow: declare error type %q: %v is an interface, which JSON cannot decode into; declare the concrete type the steps return", code, t)
	}
	if err := r.declarable(code); err != nil {
		return err
	}
	r.types = append(r.types, declaredType{
		code: code,
		match: func(err error) (json.RawMessage, bool, error) {
			var e E
			if !errors.As(err, &e) {
				return nil, false, nil
			}
			// Stored only if it comes back: a replay must find what the
			// first execution found.
			b, jerr := json.Marshal(e)
			if jerr != nil {
				return nil, true, fmt.Errorf("encode %T: %w", e, jerr)
			}
			if len(b) > MaxErrorBytes {
				return nil, true, fmt.Errorf("%T encodes to %d bytes, over MaxErrorBytes (%d)", e, len(b), MaxErrorBytes)
			}
			var back E
			if jerr := json.Unmarshal(b, &back); jerr != nil {
				return nil, true, fmt.Errorf("decode %T from its encoding: %w", e, jerr)
			}
			return b, true, nil
		},
		build: func(v json.RawMessage) (error, error) {
			var e E
			if err := json.Unmarshal(v, &e); err != nil {
				return nil, err
			}
			return e, nil
		},
	})
	return nil
}

// declarable refuses a code already declared, or reserved.
func (r *Registry) declarable(code string) error {
	if strings.HasPrefix(code, builtinPrefix) {
		return fmt.Errorf("workflow: declare error: code %q starts with %q, reserved for the errors every registry declares", code, builtinPrefix)
	}
	for _, d := range r.errs {
		if d.code == code {
			return fmt.Errorf("workflow: declare error: code %q is already declared", code)
		}
	}
	for _, d := range r.types {
		if d.code == code {
			return fmt.Errorf("workflow: declare error: code %q is already declared", code)
		}
	}
	return nil
}

// errorInfo is a failed step's error as stored (relay_workflow_steps.error_info).
// The JSON values a step's error carries (an *Error's Details, a declared
// type's encoding) are kept as strings: jsonb would reformat them, and a
// replay must see the very bytes the first execution saw.
type errorInfo struct {
	App   *storedApp        `json:"error,omitempty"`
	Codes []string          `json:"codes,omitempty"`
	Types map[string]string `json:"types,omitempty"`
}

// storedApp is an *Error as stored.
type storedApp struct {
	Type         string `json:"type"`
	Message      string `json:"message,omitempty"`
	Details      string `json:"details,omitempty"`
	NonRetryable bool   `json:"non_retryable,omitempty"`
}

// droppedType is a declared error type a step's error held that is not
// stored, as it does not round-trip as JSON: why, for the warning.
type droppedType struct {
	code string
	why  error
}

// describeError is err as it is stored with its step: its *Error, the
// codes of the declared sentinels it matches (the built-in ones
// included), and the declared types it holds. "" when none of them: the
// message alone is the error. dropped are the declared types err holds
// that do not round-trip, stored on neither execution.
func (r *Registry) describeError(err error) (info string, dropped []droppedType) {
	var in errorInfo
	var app *Error
	if errors.As(err, &app) {
		a := &storedApp{Type: app.Type, Message: boundError(app.Message), NonRetryable: app.NonRetryable}
		switch {
		case len(app.Details) == 0:
		case len(app.Details) > MaxErrorBytes:
			a.Message += fmt.Sprintf(" (details dropped: %d bytes, over %d)", len(app.Details), MaxErrorBytes)
		case !json.Valid(app.Details):
			a.Message += " (details dropped: not valid JSON)"
		default:
			a.Details = string(app.Details)
		}
		in.App = a
	}
	for _, d := range r.errs {
		if errors.Is(err, d.sentinel) || (app != nil && app.Type == d.code) {
			in.Codes = append(in.Codes, d.code)
		}
	}
	for _, d := range r.types {
		v, held, why := d.match(err)
		switch {
		case why != nil:
			dropped = append(dropped, droppedType{code: d.code, why: why})
		case held:
			if in.Types == nil {
				in.Types = map[string]string{}
			}
			in.Types[d.code] = string(v)
		}
	}
	if in.App == nil && len(in.Codes) == 0 && len(in.Types) == 0 {
		return "", dropped
	}
	b, jerr := json.Marshal(in)
	if jerr != nil {
		return "", dropped // fields of valid JSON and strings: cannot fail
	}
	return string(b), dropped
}

// rebuildError is a failed step's error for the workflow, from its stored
// message and description: the same error on the execution that ran the
// step and on every replay. A code this process has not declared matches
// nothing. A description that does not decode, or a declared type's value
// that no longer decodes into the type, is an error: the workflow would
// branch otherwise than it did (the caller fails the run, as for a step
// output that no longer decodes).
func (r *Registry) rebuildError(msg, info string) (error, error) {
	e := &storedError{msg: msg}
	if info == "" {
		return e, nil
	}
	var in errorInfo
	if err := json.Unmarshal([]byte(info), &in); err != nil {
		return nil, fmt.Errorf("decode stored error description: %w", err)
	}
	if a := in.App; a != nil {
		app := &Error{Type: a.Type, Message: a.Message, NonRetryable: a.NonRetryable}
		if a.Details != "" {
			app.Details = json.RawMessage(a.Details)
		}
		e.parts = append(e.parts, app)
	}
	for _, c := range in.Codes {
		if i := slices.IndexFunc(r.errs, func(d declaredError) bool { return d.code == c }); i >= 0 {
			e.parts = append(e.parts, r.errs[i].sentinel)
		}
	}
	for _, d := range r.types {
		if v, ok := in.Types[d.code]; ok {
			te, err := d.build(json.RawMessage(v))
			if err != nil {
				return nil, fmt.Errorf("decode stored error of declared type %q: %w", d.code, err)
			}
			e.parts = append(e.parts, te)
		}
	}
	return e, nil
}

// storedError is a step's error rebuilt from what is stored: its message,
// and the errors it matches.
type storedError struct {
	msg   string
	parts []error
}

func (e *storedError) Error() string   { return e.msg }
func (e *storedError) Unwrap() []error { return e.parts }

// nonRetryable reports whether err ends its step at once: core.Permanent,
// or an *Error marked NonRetryable.
func nonRetryable(err error) bool {
	var app *Error
	return errors.As(err, &app) && app.NonRetryable
}
