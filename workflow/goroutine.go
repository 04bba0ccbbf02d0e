package workflow

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
)

// ErrForeignGoroutine: a workflow primitive (Step, Sleep, Child, …) was
// called from a goroutine other than the one executing the run. A run's
// replay state belongs to that goroutine alone; Go runs steps in parallel.
var ErrForeignGoroutine = errors.New("workflow: primitive called from a goroutine other than the run's")

// ErrPrimitiveInStep: a workflow primitive was called inside the function
// of a step (Step, StepTx, a compensation), on the run's goroutine. A
// replay returns the step's stored output without calling its function,
// so the inner call would be made on the first execution only and every
// replay would meet another history: the call is refused at once instead.
var ErrPrimitiveInStep = errors.New("workflow: primitive called inside a step's function")

// misuse is a primitive's call from a foreign goroutine (or inside a
// step's function), kept for the run's own goroutine to fail the run with.
type misuse struct {
	err    error
	logged atomic.Bool
}

// enter guards the entry of every primitive, before it reads or changes
// any of the execution's state. Called from a goroutine other than the
// run's, it changes nothing and returns an error naming the primitive
// (the primitive returns it, or a zero value where it returns no error),
// and the run fails, without compensation, at its goroutine's next
// primitive or when its function returns: nothing the foreign call did
// reaches history. Called from the run's goroutine after such a call, it
// fails the run then.
func (x *execution) enter(primitive string) error {
	if goroutineID() != x.goroutine {
		err := fmt.Errorf("%w: %s called in run %s (use Go for parallel steps)", ErrForeignGoroutine, primitive, x.runID)
		m := &misuse{err: err}
		if !x.misused.CompareAndSwap(nil, m) {
			m = x.misused.Load()
		}
		if m.logged.CompareAndSwap(false, true) {
			x.r.logger.Error("relay: workflow primitive called from a goroutine other than the run's; the run fails",
				"run_id", x.runID, "workflow", x.run.workflow, "primitive", primitive)
		}
		return err
	}
	if m := x.misused.Load(); m != nil {
		x.fatal(m.err)
	}
	if x.unwinding != nil {
		// The function is unwinding (a suspension, a cancel, a failure)
		// and this is a deferred call, or the function recovered the
		// panic that unwinds it: the primitive does nothing and the
		// unwinding goes on, so a deferred step runs on the execution
		// whose function really returns, once, and never early.
		panic(x.unwinding)
	}
	if x.inStep != "" {
		err := fmt.Errorf("%w: %s called inside the function of step %q in run %s (call primitives from the workflow function)", ErrPrimitiveInStep, primitive, x.inStep, x.runID)
		m := &misuse{err: err}
		if x.misused.CompareAndSwap(nil, m) {
			m.logged.Store(true)
			x.r.logger.Error("relay: workflow primitive called inside a step's function; the run fails",
				"run_id", x.runID, "workflow", x.run.workflow, "primitive", primitive, "step", x.inStep)
		}
		return err
	}
	if x.deferredChild != nil && primitive != "ChildFuture.Get" {
		// Any primitive but a Get (which sees whose) writes the child's
		// start Child deferred first (see Child).
		x.startDeferredChild()
	}
	return nil
}

// goroutineIDFromStack is the calling goroutine's id, read from the
// header of its stack trace ("goroutine 18 [running]:"): the portable way
// to name a goroutine, for architectures without getg. runtime.Stack walks
// and formats every frame of the stack to write that header, so its cost
// grows with the stack's depth (BenchmarkGoroutineID).
func goroutineIDFromStack() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	const prefix = "goroutine "
	if len(b) <= len(prefix) {
		return 0
	}
	var id uint64
	for _, c := range b[len(prefix):] {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}
