package core

import (
	"errors"
	"fmt"
	"time"

	"github.com/relayq/relay/internal/dbx"
	"github.com/relayq/relay/internal/fence"
)

var (
	// ErrNotFound: no job has that id.
	ErrNotFound = errors.New("core: job not found")
	// ErrIllegalTransition: the state machine does not allow the change
	// asked for from the job's current state.
	ErrIllegalTransition = errors.New("core: illegal job state transition")
	// ErrLeaseLost: the attempt's lease token no longer matches, because
	// the lease expired and the job was rescued, or the job was cancelled. The
	// write was not made.
	ErrLeaseLost = fence.ErrLeaseLost
	// ErrUnknownKind: no worker is registered for the job's kind in this
	// process. The job is retried (another deployment may know the kind) and
	// ends dead when its attempts run out.
	ErrUnknownKind = errors.New("core: no worker registered for job kind")
	// ErrJobCancelled is the cause of a handler's context cancellation when
	// its job was cancelled (see Cancel) while running.
	ErrJobCancelled = errors.New("core: job cancelled")
	// ErrShutdown is the cause of a handler's context cancellation when the
	// client stops before the handler finished.
	ErrShutdown = errors.New("core: client stopped")
	// ErrUnsupportedDB: a DB argument of a type Relay cannot run SQL through.
	ErrUnsupportedDB = dbx.ErrUnsupported

	// ErrUniqueConflict: a requeue would make a second job with the same
	// unique key queued or running (see UniqueOpts).
	ErrUniqueConflict = errors.New("core: another job with the same unique key is in a unique state")
)

// ValidationError reports enqueue input refused before anything was written.
type ValidationError struct {
	Field  string
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("core: invalid %s: %s", e.Field, e.Reason)
}

// permanentError marks a handler error that must not be retried.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err so the job fails without further attempts and ends
// dead, whatever attempts remain.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("failed permanently")
	}
	return &permanentError{err: err}
}

// retryInError asks for the next attempt after a chosen delay.
type retryInError struct {
	delay time.Duration
	err   error
}

// Error is the handler's own error: the delay is a directive, recorded
// beside the error (AttemptRecord.RetryIn), not part of it.
func (e *retryInError) Error() string {
	if e.err == nil {
		return "core: retry requested"
	}
	return e.err.Error()
}
func (e *retryInError) Unwrap() error { return e.err }

// RetryIn fails this attempt and schedules the next one after delay instead
// of the retry policy's backoff. It still counts as an attempt: when none
// remain the job ends dead. err (may be nil) is recorded as the reason,
// as it is (the returned error's message is err's), and the delay beside it
// in the attempt's history (AttemptRecord.RetryIn).
func RetryIn(delay time.Duration, err error) error {
	if delay < 0 {
		delay = 0
	}
	return &retryInError{delay: delay, err: err}
}

// PanicError is the error of an attempt whose handler panicked: the
// recovered value and the stack. Middleware and error hooks see it (use
// errors.As); the job's last_error records its text.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("core: worker panicked: %v\n%s", e.Value, e.Stack)
}

// IsPermanent reports whether err was wrapped by Permanent.
func IsPermanent(err error) bool {
	var perm *permanentError
	return errors.As(err, &perm)
}

// RetryInRequested returns the delay asked for by a RetryIn error in err's chain.
func RetryInRequested(err error) (time.Duration, bool) {
	var rin *retryInError
	if errors.As(err, &rin) {
		return rin.delay, true
	}
	return 0, false
}
