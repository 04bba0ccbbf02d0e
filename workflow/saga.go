package workflow

import (
	"context"
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
	for _, c := range x.comps {
		if c.key == key {
			x.fatal(fmt.Errorf("%w: compensation %q registered twice in run %s", ErrDuplicateKey, key, x.runID))
		}
	}
	x.comps = append(x.comps, compensation{key: key, fn: fn})
}

// compensate runs the registered compensations in reverse and records the
// run's end: final (failed or cancelled) when none is registered, else
// compensated (or cancelled), or failed if a compensation fails.
func (x *execution) compensate(final RunState, cause string) (err error) {
	if len(x.comps) == 0 {
		return x.finish(final, nil, cause)
	}
	x.compensating = true
	x.setState = StateCompensating
	wctx := Context{Context: x.ctx, x: x}
	var failed error
	func() {
		defer func() {
			if p := recover(); p != nil {
				u, ok := p.(*unwind)
				if !ok {
					panic(p)
				}
				err = x.unwound(u, nil)
				failed = errUnwound
			}
		}()
		for i := len(x.comps) - 1; i >= 0; i-- {
			c := x.comps[i]
			if _, err := Step(wctx, "compensate:"+c.key, func(ctx context.Context) (struct{}, error) {
				return struct{}{}, c.fn(ctx)
			}, nil); err != nil {
				failed = err
				return
			}
		}
	}()
	switch {
	case failed == errUnwound:
		return err
	case failed != nil:
		return x.finish(StateFailed, nil, cause+"; compensation failed: "+failed.Error())
	case final == StateCancelled:
		return x.finish(StateCancelled, nil, cause)
	}
	return x.finish(StateCompensated, nil, cause)
}

var errUnwound = fmt.Errorf("unwound")
