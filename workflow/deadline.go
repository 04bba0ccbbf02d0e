package workflow

import (
	"fmt"
	"time"
)

// dbNow is the database's clock now, as the execution knows it: the
// database's now() when the execution began (its load) moved on by the
// time since, on this process's monotonic clock; the test environment's
// virtual clock when it installed one (clock). The run's deadline (its
// execution timeout, deadline_at, written by sqlStartRun) is compared
// with it here, and a suspension is cut to wake at it (suspend): a
// virtual clock that skips a sleep skips to the deadline the same way.
func (x *execution) dbNow() time.Time {
	if x.hooks != nil && x.hooks.Now != nil {
		return x.hooks.Now()
	}
	return x.now.Add(time.Since(x.began))
}

// checkDeadline fails the run, with its compensations, once its execution
// timeout (StartOpts.ExecutionTimeout) has passed: called where the run is
// about to do something new (checkCancel), so a replay registers its
// compensations first. The compensations themselves run past it.
func (x *execution) checkDeadline() {
	if x.run.deadline == nil || x.compensating || x.run.deadline.After(x.dbNow()) {
		return
	}
	x.stop(&unwind{kind: unwindTimeout, err: fmt.Errorf("%w: run %s passed its deadline %s",
		ErrRunTimedOut, x.runID, x.run.deadline.UTC().Format(time.RFC3339Nano))})
}

// ErrRunTimedOut is in the error of a run that its execution timeout
// (StartOpts.ExecutionTimeout) failed: the run's error message starts
// with its text.
var ErrRunTimedOut = fmt.Errorf("workflow: execution timeout")

// deadlineParam is the execution timeout as sqlStartRun's parameter: its
// microseconds, or nil for none.
func deadlineParam(d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return d.Microseconds()
}
