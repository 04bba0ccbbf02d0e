package workflow

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"
)

// StepFuture is a step started by Go, running alongside the workflow.
type StepFuture[T any] struct {
	x      *execution
	plan   stepPlan
	done   chan struct{}
	out    T
	enc    []byte
	err    error
	stored *T     // the output history holds (replay)
	failed error  // the failure history holds (replay)
	ended  bool   // Get has settled it
	cancel func() // ends the attempt's context
	began  time.Time
	fnEnd  time.Time // when fn returned
}

// Go starts fn as the step key in a goroutine of its own, at once, and
// returns its future: several Go calls run their steps in parallel (fan-out
// of outside calls within one execution, cheaper than child runs); Get
// collects each. The step is checkpointed when Get is called, with Step's
// semantics (at-least-once, retries by suspending the run, a *StepError when
// it fails for good). fn must not call this package's primitives. Call Get
// on every future, in an order that does not depend on which finished
// first.
func Go[T any](wctx Context, key string, fn func(ctx context.Context) (T, error), opts *StepOpts) *StepFuture[T] {
	x := wctx.x
	x.userKey("step", key)
	p, out, err, done := planStep[T](x, "step", key, opts)
	f := &StepFuture[T]{x: x, plan: p, done: make(chan struct{})}
	if done {
		if err != nil {
			f.failed = err
		} else {
			f.stored = &out
		}
		close(f.done)
		return f
	}
	x.flush()
	x.checkCancel()
	ctx, span := x.stepSpan("step", key, p.n)
	ctx, cancel := context.WithCancel(ctx)
	if p.timeout > 0 {
		var c2 context.CancelFunc
		ctx, c2 = context.WithTimeout(ctx, p.timeout)
		prev := cancel
		cancel = func() { c2(); prev() }
	}
	f.cancel = cancel
	f.began = time.Now()
	x.goroutines.Add(1)
	x.cancels = append(x.cancels, cancel)
	go func() {
		defer x.goroutines.Done()
		defer close(f.done)
		defer func() {
			if r := recover(); r != nil {
				f.err = fmt.Errorf("step panicked: %v\n%s", r, debug.Stack())
				f.fnEnd = time.Now()
			}
			endSpan(span, f.err)
		}()
		f.out, f.err = fn(ctx)
		f.fnEnd = time.Now()
		if f.err == nil {
			var err error
			if f.enc, err = encode("output of step "+key, f.out); err != nil {
				f.err = permanent(err)
			}
		}
	}()
	return f
}

// Get waits for the step started by Go and returns its output, checkpointing
// it (or, for a failed attempt with attempts left, suspending the run until
// its retry, when Go runs it again).
func (f *StepFuture[T]) Get(wctx Context) (T, error) {
	switch {
	case f.stored != nil:
		return *f.stored, nil
	case f.failed != nil:
		var zero T
		return zero, f.failed
	}
	<-f.done
	f.cancel()
	if f.ended {
		var zero T
		return zero, fmt.Errorf("workflow: run %s: Get called twice on step %q", f.x.runID, f.plan.key)
	}
	f.ended = true
	return settleStep(f.x, f.plan, f.began, f.fnEnd, f.out, f.enc, f.err, false)
}
