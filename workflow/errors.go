package workflow

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/relayq/relay/internal/eager"
)

var (
	// ErrUnregistered: no workflow of that name is registered.
	ErrUnregistered = errors.New("workflow: workflow not registered")
	// ErrRunNotFound: no run has that id.
	ErrRunNotFound = errors.New("workflow: run not found")
	// ErrRunFinished: the run has finished; it takes no signal or cancel.
	ErrRunFinished = errors.New("workflow: run already finished")
	// ErrIDInUse: a run with the id asked for exists for another workflow
	// (Start), or is not the child of the parent starting it (Child).
	ErrIDInUse = errors.New("workflow: run id in use by another run")
	// ErrRunFailed, ErrRunCompensated and ErrRunCancelled are matched by a
	// *RunError (errors.Is) for each way a run can end without an output.
	ErrRunFailed      = errors.New("workflow: run failed")
	ErrRunCompensated = errors.New("workflow: run failed and was compensated")
	ErrRunCancelled   = errors.New("workflow: run cancelled")
	// ErrDuplicateKey: a run used the same step key twice.
	ErrDuplicateKey = errors.New("workflow: duplicate step key")
	// ErrTooLarge: an input, output or payload exceeds MaxPayloadBytes, or
	// a signal MaxSignalBytes.
	ErrTooLarge = errors.New("workflow: payload too large")
	// ErrTooDeep: a signal's payload nests deeper than MaxSignalDepth.
	ErrTooDeep = errors.New("workflow: payload nested too deep")
	// ErrNotWorked: RunNow was given a client that does not serve the
	// run's queue with the workers of the workflow's registry, so it cannot
	// claim the run. Nothing was written.
	ErrNotWorked = eager.ErrNotWorked
	// ErrNotRetryable: Retry was asked of a run that is not failed.
	ErrNotRetryable = errors.New("workflow: only a failed run can be retried")
	// ErrReservedKey: a step key given in code uses a prefix the package
	// generates keys with (ReservedKeyPrefixes), or a child key would
	// clash with a child id of a later generation.
	ErrReservedKey = errors.New("workflow: reserved step key")
)

// ReservedKeyPrefixes are the prefixes of the step keys this package
// generates: a compensation ("compensate:<key>"), a signal wait
// ("signal:<name>#<n>"), a patch ("patch:<name>"), an event
// ("event:<key>#<n>"), added tags ("tags:<n>") and an update
// ("update:<name>#<n>"). A key given to Step, StepTx, Go, Sleep, SleepUntil,
// Child, Now, Random or UUID must not start with one of them: the call
// fails the run with ErrReservedKey (a programming error, as a duplicate
// key), rather than let the key meet a generated one.
var ReservedKeyPrefixes = []string{"compensate:", "signal:", "patch:", "event:", "tags:", "update:"}

// MaxErrorBytes bounds the error text stored for a run (Run.Error,
// RunError.Message) and for a step (StepInfo.Error, StepError.Message,
// each entry of StepInfo.AttemptLog): longer text is cut on a UTF-8
// boundary and ends with a marker saying how long it was (see
// boundText).
const MaxErrorBytes = 8 << 10

// boundText makes s storable and bounded: invalid UTF-8 is replaced, NUL
// bytes (which PostgreSQL text refuses) are dropped, and text over max
// bytes is cut on a rune boundary, keeping room for the marker
// "…(truncated, N bytes)" that ends it (N: the sanitized text's length).
func boundText(s string, max int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "")
	}
	if len(s) <= max {
		return s
	}
	marker := fmt.Sprintf("…(truncated, %d bytes)", len(s))
	cut := max - len(marker)
	if cut < 0 {
		cut = 0
	}
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + marker
}

// boundError is boundText at MaxErrorBytes.
func boundError(s string) string { return boundText(s, MaxErrorBytes) }

// MaxPayloadBytes bounds a run's input and output, a step's output, a
// signal's payload and an event's value, encoded as JSON (1 MiB). Larger
// values are refused with ErrTooLarge before anything is written: keep
// large data in your own tables and pass its key.
const MaxPayloadBytes = 1 << 20

// NonDeterminismError reports a replay that reached, at some position of
// the run's history, a step other than the one recorded there: the code
// changed under a run in flight (without Patch), or branched on something
// not recorded (time, randomness, a map's order, data read outside a step).
// The run fails rather than diverge from its history.
type NonDeterminismError struct {
	RunID      string
	Position   int
	HistoryKey string // the key recorded at Position ("kind:key")
	CodeKey    string // the key the code asked for at Position ("kind:key")
}

func (e *NonDeterminismError) Error() string {
	return fmt.Sprintf("workflow: non-determinism in run %s at step position %d: history holds %q, code asked for %q (did the code change under a run in flight? use Patch)",
		e.RunID, e.Position, e.HistoryKey, e.CodeKey)
}

// StepError is the error of a step that failed for good: permanently
// (core.Permanent, an *Error marked NonRetryable) or with its attempts
// used up. It is rebuilt from what the step's checkpoint stores, on the
// execution that ran the step as on every replay, so the workflow sees the
// same error on each: Err carries the message, the *Error the step's
// error held, and the sentinels and types declared with DeclareError and
// DeclareErrorType that it matched (errors.Is and errors.As see through
// it); nothing else of the original error.
type StepError struct {
	RunID    string
	Key      string
	Attempts int
	Message  string
	Err      error
}

func (e *StepError) Error() string {
	return fmt.Sprintf("workflow: step %q of run %s failed after %d attempt(s): %s", e.Key, e.RunID, e.Attempts, e.Message)
}
func (e *StepError) Unwrap() error { return e.Err }

// RunError is a run's outcome when it did not complete: Result returns it.
type RunError struct {
	RunID    string
	Workflow string
	State    RunState
	Message  string
}

func (e *RunError) Error() string {
	return fmt.Sprintf("workflow: run %s (%s) %s: %s", e.RunID, e.Workflow, e.State, e.Message)
}

// Is matches ErrRunFailed, ErrRunCompensated, ErrRunCancelled or
// ErrRunTerminated by State.
func (e *RunError) Is(target error) bool {
	switch target {
	case ErrRunFailed:
		return e.State == StateFailed
	case ErrRunCompensated:
		return e.State == StateCompensated
	case ErrRunCancelled:
		return e.State == StateCancelled
	case ErrRunTerminated:
		return e.State == StateTerminated
	}
	return false
}

// ChildError is a child run's outcome when it did not complete, returned by
// its ChildFuture's Get. State is empty when the child never started because
// another run holds its id (one not started by this parent at this
// position): the error then matches ErrIDInUse (errors.Is), and Message
// says who holds the id.
type ChildError struct {
	RunID   string
	State   RunState
	Message string
}

func (e *ChildError) Error() string {
	if e.State == "" {
		return fmt.Sprintf("workflow: child run %s not started: %s", e.RunID, e.Message)
	}
	return fmt.Sprintf("workflow: child run %s %s: %s", e.RunID, e.State, e.Message)
}

// Is matches ErrIDInUse for a child that never started because its id is
// held by another run.
func (e *ChildError) Is(target error) bool { return target == ErrIDInUse && e.State == "" }
