package workflow

import (
	"context"
	"errors"
	"fmt"
)

// compensation is an undo registered by Compensate.
type compensation struct {
	key string
	fn  func(ctx context.Context) error
}

// Compensate registers fn as the undo of what the run did so far (call it
// right after the step it undoes completed). If the run then fails (its
// function returns an error) or is cancelled, the registered compensations
// run newest first, each as a checkpointed step "compensate:<key>" with the
// default retries, and the run ends compensated (cancelled, for a cancel),
// or failed with the compensation's error if one fails for good.
//
// Registration is not a step: it is made again by every replay, so call it
// unconditionally on the path that did the work.
func Compensate(wctx Context, key string, fn func(ctx context.Context) error) {
	x := wctx.x
	if x.enter("Compensate") != nil {
		return // the run fails (enter): nothing is registered
	}
	for _, c := range x.comps {
		if c.key == key {
			x.fatal(fmt.Errorf("%w: compensation %q registered twice in run %s", ErrDuplicateKey, key, x.runID))
		}
	}
	x.comps = append(x.comps, compensation{key: key, fn: fn})
}

// compensate runs the registered compensations in reverse and records the
// run's end: final (failed or cancelled) when none is registered, else
// compensated (or cancelled). Every compensation runs, each a checkpointed
// step with the default retries: one that fails for good is recorded and
// the older ones still run; the run then ends failed, its error naming
// every compensation that failed.
func (x *execution) compensate(final RunState, cause string) (err error) {
	if len(x.comps) == 0 {
		return x.finish(final, nil, cause)
	}
	// A run that fails in its compensations runs again only those that
	// failed (sqlRetryDropFailedCompensations): none of its function's steps.
	x.retryFrom = nil
	x.compensating = true
	x.setState = StateCompensating
	wctx := Context{Context: x.ctx, x: x}
	var failed []error
	unwound := false
	func() {
		defer func() {
			if p := recover(); p != nil {
				u, ok := p.(*unwind)
				if !ok {
					panic(p)
				}
				err = x.unwound(u, nil)
				unwound = true
			}
		}()
		for i := len(x.comps) - 1; i >= 0; i-- {
			c := x.comps[i]
			if _, err := step(wctx, compensationPrefix+c.key, func(ctx context.Context) (struct{}, error) {
				return struct{}{}, c.fn(ctx)
			}, nil); err != nil {
				failed = append(failed, err) // recorded as failed; the older ones still run
			}
		}
	}()
	switch {
	case unwound:
		return err
	case len(failed) > 0:
		return x.finish(StateFailed, nil, compensationFailure(cause, failed))
	case final == StateCancelled:
		return x.finish(StateCancelled, nil, cause)
	}
	err = x.finish(StateCompensated, nil, cause)
	if errors.Is(err, errCancelWins) {
		// A cancel asked for while the compensations ran: they all ran,
		// and the run ends as the cancel said.
		return x.finish(StateCancelled, nil, cancelledMsg+" (while compensating: "+boundText(cause, MaxErrorBytes/2)+")")
	}
	return err
}

// compensationPrefix starts the key of every compensation's step.
const compensationPrefix = "compensate:"

// compensationFailure is the error of a run whose compensations failed:
// the cause of the compensation (bounded to half of MaxErrorBytes, so the
// failures that follow it stay readable), then each failed compensation's
// error, newest first, as errors.Join joins them.
func compensationFailure(cause string, failed []error) string {
	return fmt.Sprintf("%s; %d compensation(s) failed: %s", boundText(cause, MaxErrorBytes/2), len(failed), errors.Join(failed...))
}

// interrupted ends an execution whose function returned err after the
// execution was stopped (its lease deadline passed unrenewed, the client
// shut down, the job was cancelled): err is likely that stop seen through
// the function's own calls ("context canceled"), not the run's failure, so
// nothing is recorded and the next execution runs the function again, as
// for a step interrupted so (settleStep). The lease may still pass the
// fence at that moment (a deadline passes locally before the rescuer ends
// the lease), so the outcome must not be written: that failed runs of
// relay prove workflow under load.
func (x *execution) interrupted(err error) error {
	return fmt.Errorf("workflow: run %s: execution stopped (%v) while the function returned: %w", x.runID, context.Cause(x.ctx), err)
}
