package workflow

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/relayq/relay/internal/wfhook"
)

// StepFuture is a step started by Go, running alongside the workflow.
type StepFuture[T any] struct {
	x      *execution
	plan   stepPlan
	res    chan goResult[T] // the attempt's outcome, sent once
	ctx    context.Context  // the attempt's (its deadline: StepOpts.Timeout)
	gate   *gate            // who ends the attempt: its goroutine, or Get at the timeout
	stored *T               // the output history holds (replay)
	failed error            // the failure history holds (replay)
	ended  bool             // Get has settled it
	cancel func()           // ends the attempt's context
	began  time.Time
	// returnedCh is closed once the attempt's outcome is in res (Select's
	// OnStep looks at it).
	returnedCh chan struct{}
}

// returned reports whether Get would return without waiting for fn: the
// attempt has returned, or history answers.
func (f *StepFuture[T]) returned() bool {
	if f.stored != nil || f.failed != nil || f.ended || f.returnedCh == nil {
		return true
	}
	if f.gate != nil && f.ctx.Err() != nil {
		return true // past its timeout: Get returns the timeout
	}
	select {
	case <-f.returnedCh:
		return true
	default:
		return false
	}
}

func (f *StepFuture[T]) returnedChan() <-chan struct{} { return f.returnedCh }

// goResult is what a Go step's attempt returned.
type goResult[T any] struct {
	out   T
	enc   []byte
	err   error
	fnEnd time.Time // when fn returned
}

// Go starts fn as the step key in a goroutine of its own, at once, and
// returns its future: several Go calls run their steps in parallel (fan-out
// of outside calls within one execution, cheaper than child runs); Get
// collects each. The step is checkpointed when Get is called, with Step's
// semantics (at-least-once, retries by suspending the run, a *StepError when
// it fails for good, StepOpts.Timeout enforced: Get returns at the timeout
// and discards a later result). fn must not call this package's
// primitives. Call Get on every future, in an order that does not depend
// on which finished first.
func Go[T any](wctx Context, key string, fn func(ctx context.Context) (T, error), opts *StepOpts) *StepFuture[T] {
	x := wctx.x
	if err := x.enter("Go"); err != nil {
		return &StepFuture[T]{x: x, failed: err} // Get returns err
	}
	x.userKey("step", key)
	p, out, err, done := planStep[T](x, "step", key, opts)
	f := &StepFuture[T]{x: x, plan: p}
	if p.expired != nil {
		expired := p.expired // past ScheduleToClose: the attempt fails at once
		fn = func(context.Context) (T, error) { var zero T; return zero, permanent(expired) }
	}
	if done {
		if err != nil {
			f.failed = err
		} else {
			f.stored = &out
		}
		return f
	}
	x.flush()
	x.checkCancel()
	x.crashAt(key, wfhook.BeforeStep)
	fn = fakeStep(x, key, fn)
	ctx, span := x.stepSpan("step", key, p.n)
	ctx = withBeat(ctx, x, p)
	ctx, cancel := context.WithCancel(ctx)
	if p.timeout > 0 {
		var c2 context.CancelFunc
		ctx, c2 = context.WithTimeout(ctx, p.timeout)
		prev := cancel
		cancel = func() { c2(); prev() }
		f.gate = &gate{}
	}
	if p.heartbeat > 0 {
		var stopBeats func()
		ctx, stopBeats = watchHeartbeats(ctx, p.heartbeat)
		prev := cancel
		cancel = func() { stopBeats(); prev() }
		f.gate = &gate{}
	}
	f.ctx, f.cancel = ctx, cancel
	f.res = make(chan goResult[T], 1) // an abandoned attempt's send never blocks
	f.returnedCh = make(chan struct{})
	f.began = time.Now()
	x.goroutines.Add(1)
	x.cancels = append(x.cancels, cancel)
	go func() {
		var r goResult[T]
		defer func() {
			if p := recover(); p != nil {
				r.err = fmt.Errorf("step panicked: %v\n%s", p, debug.Stack())
				r.fnEnd = time.Now()
			}
			endSpan(span, r.err)
			f.res <- r
			close(f.returnedCh)
			if f.gate.commit() {
				x.goroutines.Done()
			} else {
				x.lateResult(f.plan) // Get abandoned it (and called Done)
			}
		}()
		r.out, r.err = fn(ctx)
		r.fnEnd = time.Now()
		if r.err == nil {
			var err error
			if r.enc, err = encode("output of step "+key, r.out); err != nil {
				r.err = permanent(err)
			}
		}
	}()
	return f
}

// Get waits for the step started by Go and returns its output, checkpointing
// it (or, for a failed attempt with attempts left, suspending the run until
// its retry, when Go runs it again). With StepOpts.Timeout, Get waits no
// longer than the attempt's timeout: the attempt then fails with
// ErrStepTimeout.
func (f *StepFuture[T]) Get(wctx Context) (T, error) {
	if err := f.x.enter("StepFuture.Get"); err != nil {
		var zero T
		return zero, err
	}
	switch {
	case f.stored != nil:
		return *f.stored, nil
	case f.failed != nil:
		var zero T
		return zero, f.failed
	}
	if f.ended {
		var zero T
		return zero, fmt.Errorf("workflow: run %s: Get called twice on step %q", f.x.runID, f.plan.key)
	}
	f.ended = true
	var r goResult[T]
	if f.gate == nil {
		r = <-f.res
	} else {
		select {
		case r = <-f.res:
			switch {
			case r.err != nil && f.x.ctx.Err() == nil && lapsed(f.ctx):
				r.err = heartbeatError(f.plan.heartbeat, r.err) // failed at the lapse
			case r.err != nil && f.x.ctx.Err() == nil && errors.Is(f.ctx.Err(), context.DeadlineExceeded):
				r.err = timeoutError(f.plan.timeout, r.err) // failed at its deadline: a timeout
			}
		case <-f.ctx.Done():
			if !f.gate.expire() {
				r = <-f.res // it ended just now
				break
			}
			f.x.goroutines.Done() // abandoned: the execution does not wait for it
			r = goResult[T]{err: timeoutError(f.plan.timeout, nil), fnEnd: time.Now()}
			if lapsed(f.ctx) {
				r.err = heartbeatError(f.plan.heartbeat, nil)
			}
			if f.x.ctx.Err() != nil {
				r.err = context.Cause(f.x.ctx)
			}
		}
	}
	f.cancel()
	return settleStep(f.x, f.plan, f.began, r.fnEnd, r.out, r.enc, r.err, false)
}
