package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"
)

// ChildOpts tune a child run. The zero value (or nil) runs the child on its
// parent's queue.
type ChildOpts struct {
	// Queue runs the child's executions on another queue (its own workers
	// and concurrency), e.g. "email" while the parent runs on "payments".
	Queue string
	// Priority orders the child's executions in their queue.
	Priority int
	// MaxAttempts bounds the child's crashed or failed executions.
	MaxAttempts int
	// ParentClose is what the parent's end does to the child if it has not
	// finished: ParentCloseCancel (the default), ParentCloseAbandon or
	// ParentCloseTerminate.
	ParentClose ParentClosePolicy
}

// ChildFuture is a child run started by Child. Get waits for its outcome.
type ChildFuture[Out any] struct {
	x   *execution
	pos int
	// RunID is the child run's id: "<parent id>/<key>" (with the parent's
	// generation after a ContinueAsNew).
	RunID string
	err   error // Child was refused (enter): Get returns it
}

// Child starts a run of wf with input in as a child of this run, under
// key: the child is started once (the start is checkpointed with the
// parent's step), runs on its own (on opts.Queue if set), and its
// completion wakes the parent in the transaction that records it. Start
// several children before calling Get on any for fan-out/fan-in.
//
// A child does not outlive its parent unless it is abandoned: when the
// parent ends (completed, failed, compensated, cancelled or terminated) or
// continues as new, its children still unfinished (started, their outcome
// never collected by Get) are closed in the transaction that records the
// parent's end, per ChildOpts.ParentClose: asked to cancel by default
// (they run their own compensations, as for Cancel: Temporal's default
// ParentClosePolicy, TERMINATE, with the undo a cancel gives), terminated,
// or left running (ParentCloseAbandon). A run meant to outlive its
// starter is started with Start in a StepTx, with a fixed StartOpts.ID.
//
// A child is only ever its parent's own: a run that already holds the
// child's id is taken as the child only if this parent started it at this
// position. Any other holder is left alone, and Get returns a *ChildError
// matching ErrIDInUse (on this execution and every replay).
func Child[In, Out any](wctx Context, key string, wf *Workflow[In, Out], in In, opts *ChildOpts) *ChildFuture[Out] {
	x := wctx.x
	if err := x.enter("Child"); err != nil {
		return &ChildFuture[Out]{x: x, pos: -1, err: err}
	}
	x.userKey("child", key)
	pos, h := x.next("child", key)
	if h != nil {
		return &ChildFuture[Out]{x: x, pos: pos, RunID: h.childID}
	}
	x.checkCancel()
	input, err := encode("input of child "+key, in)
	if err != nil {
		x.fatal(fmt.Errorf("workflow: run %s: child %q: %w", x.runID, key, err))
	}
	id := x.runID + "/" + key
	if x.run.generation > 0 {
		id = x.runID + "/" + strconv.Itoa(x.run.generation) + "/" + key
	}
	so := &StartOpts{ID: id, Queue: x.run.queue}
	var parentClose ParentClosePolicy
	if opts != nil {
		if err := opts.ParentClose.check(); err != nil {
			x.fatal(fmt.Errorf("workflow: run %s: child %q: %w", x.runID, key, err))
		}
		parentClose = opts.ParentClose
		if opts.Queue != "" {
			so.Queue = opts.Queue
		}
		so.Priority, so.MaxAttempts = opts.Priority, opts.MaxAttempts
	}
	link := &parentLink{runID: x.runID, position: pos}
	x.fenced(func(ctx context.Context, tx pgx.Tx) error {
		// The child's root span goes under this one, in the run's trace;
		// the writes keep the write's own context.
		_, span := x.stepSpan("child", key, 1)
		defer span.End()
		ctx = trace.ContextWithSpan(ctx, span)
		link.wake = nil // a retried transaction starts it again
		_, _, err := startRun(ctx, tx, x.r.tracer, wf.name, input, so, link)
		if errors.Is(err, ErrIDInUse) {
			// Another run holds the id: the step fails, on this execution
			// and every replay, with an error the workflow can handle.
			_, err = x.upsert(ctx, tx, &stepRow{position: pos, key: key, kind: "child", state: stepFailed, childID: id,
				errMsg: encodeChildError(&ChildError{RunID: id, Message: boundError(err.Error())})}, 1, nil, -1)
			return err
		}
		if err != nil {
			return err
		}
		if parentClose != ParentCloseCancel {
			if _, err := tx.Exec(ctx, sqlSetParentClose, id, parentClose.stored()); err != nil {
				return fmt.Errorf("set the parent-close policy of child %s: %w", id, err)
			}
		}
		_, err = x.upsert(ctx, tx, &stepRow{position: pos, key: key, kind: "child", state: stepWaiting, childID: id}, 0, nil, -1)
		return err
	})
	if link.wake != nil {
		// Committed: the child's queue is woken now (bounded: a wake-up
		// lost to a slow server costs the workers' next poll, no more).
		ctx, cancel := context.WithTimeout(context.WithoutCancel(x.ctx), wakeTimeout)
		link.wake(ctx, x.r.pool)
		cancel()
	}
	return &ChildFuture[Out]{x: x, pos: pos, RunID: id}
}

// Get returns the child's output, suspending the parent until the child
// finishes. A child that failed, was compensated or cancelled returns a
// *ChildError. The outcome is checkpointed in the parent: replays return
// it without reading the child again.
func (f *ChildFuture[Out]) Get(wctx Context) (Out, error) {
	x := f.x
	var zero Out
	if err := x.enter("ChildFuture.Get"); err != nil {
		return zero, err
	}
	if f.err != nil {
		return zero, f.err
	}
	h := x.hist[f.pos]
	decode := func(s *stepRow) (Out, error) {
		if s.errMsg != "" {
			var ce ChildError
			if json.Unmarshal([]byte(s.errMsg), &ce) == nil && ce.RunID != "" {
				return zero, &ce
			}
			return zero, &ChildError{RunID: f.RunID, State: StateFailed, Message: s.errMsg}
		}
		var out Out
		if err := json.Unmarshal([]byte(s.output), &out); err != nil {
			return zero, fmt.Errorf("workflow: run %s: decode output of child %s into %T: %w", x.runID, f.RunID, out, err)
		}
		return out, nil
	}
	if h != nil && (h.state == stepCompleted || h.state == stepFailed) {
		return decode(h)
	}
	x.endDryRun()
	var state, output, msg string
	var final bool
	err := x.r.pool.QueryRow(x.ctx, sqlChildOutcome, f.RunID).Scan(&state, &output, &msg, &final)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Deleted (Delete) before this run read its outcome: it will never
		// come, and every execution would fail here alike.
		state, msg, final = string(StateFailed), "child run not found (deleted before its parent read its outcome)", true
	case err != nil:
		x.stop(&unwind{kind: unwindAbort, err: fmt.Errorf("workflow: run %s: read child %s: %w", x.runID, f.RunID, err)})
	}
	if !final {
		x.checkCancel()
		x.suspend(maxSuspend) // the child's completion wakes this run
	}
	s := &stepRow{position: f.pos, key: h.key, kind: "child", state: stepCompleted, childID: f.RunID}
	if RunState(state) == StateCompleted {
		s.output = output
	} else {
		// Failed: Retry of this run starts again here (Retry the child
		// first to have it run again).
		s.state, s.errMsg = stepFailed, encodeChildError(&ChildError{RunID: f.RunID, State: RunState(state), Message: msg})
	}
	// Deferred to the execution's next write, as a completed step's
	// checkpoint is (later): the outcome is durable in the child's own
	// run, which a replay reads again if this checkpoint never commits.
	x.later(s)
	return decode(s)
}

// encodeChildError is a child step's stored error (decoded by Get).
func encodeChildError(ce *ChildError) string {
	b, _ := json.Marshal(ce) // strings only: cannot fail
	return string(b)
}

// openChildren reports whether the run started children whose outcome it
// has not collected: their checkpoints still wait. They may have finished
// meanwhile; cancelling asks only those that have not.
func (x *execution) openChildren() bool {
	for _, s := range x.hist {
		if s.kind == "child" && s.state == stepWaiting {
			return true
		}
	}
	return false
}

// cancelChildren asks the run's unfinished children (and theirs) to
// cancel, and wakes them, in tx: the run itself goes on (ContinueAsNew).
func (x *execution) cancelChildren(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, sqlRequestCancelChildren, x.runID); err != nil {
		return fmt.Errorf("cancel children: %w", err)
	}
	return nil
}
