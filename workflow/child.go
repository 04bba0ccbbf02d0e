package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/eager"
	"github.com/relayq/relay/internal/jobinsert"
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
	// fresh is the child as this execution inserted it (nil when it
	// existed, or on a replay): Get may execute it here (executeChild).
	fresh *freshChild
	// start is the child's start while Child defers it (the execution's
	// deferredChild until its next primitive).
	start *childStart
}

// freshChild is a child run this execution inserted: its job, and the run
// as inserted (an execution of it starts from this, as an eager run's
// first one does, instead of reading it back).
type freshChild struct {
	jobID int64
	run   runInfo
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
	f := &ChildFuture[Out]{x: x, pos: pos, RunID: id}
	d := &childStart{name: wf.name, input: input, so: *so, parentClose: parentClose,
		link: &parentLink{runID: x.runID, position: pos}, key: key, fresh: &f.fresh}
	if x.mayExecuteChild(so.Queue) {
		// Deferred to the execution's next primitive: if that is this
		// child's Get, the child's job is inserted already claimed for
		// this execution's slot (executeChildStart), one row version
		// instead of an insert and a claim. Anything else writes the
		// start first, as here (startDeferredChild).
		x.deferredChild, f.start = d, d
		return f
	}
	x.startChildNow(d)
	return f
}

// childStart is a child's start as Child asked for it, written by
// startChildNow or executeChildStart.
type childStart struct {
	name        string
	input       []byte
	so          StartOpts
	parentClose ParentClosePolicy
	link        *parentLink
	key         string
	// fresh is the future's: set when the start inserted the child.
	fresh **freshChild
}

// mayExecuteChild reports whether a child on queue may be executed in
// this execution's worker slot (the conditions of executeChild).
func (x *execution) mayExecuteChild(queue string) bool {
	// A run with an execution timeout waits for its child suspended,
	// woken at its deadline (suspend), not blocked in Get for as long
	// as the child's execution takes.
	return !x.cancelling && !x.dryRun && x.hooks == nil && x.job != nil && queue == x.job.Queue && x.run.deadline == nil
}

// startDeferredChild writes the start Child deferred, if any, as Child
// writes a start it does not defer: the execution's next primitive is not
// that child's Get, or its function returned.
func (x *execution) startDeferredChild() {
	if d := x.deferredChild; d != nil {
		x.deferredChild = nil
		x.startChildNow(d)
	}
}

// settleDeferredChild is startDeferredChild once the function returned,
// outside the primitives' recover: the unwind of a failed start is
// returned rather than raised.
func (x *execution) settleDeferredChild() (u *unwind) {
	if x.deferredChild == nil {
		return nil
	}
	was := x.unwinding
	defer func() {
		if p := recover(); p != nil {
			uw, ok := p.(*unwind)
			if !ok {
				panic(p)
			}
			x.unwinding, u = was, uw
		}
	}()
	x.startDeferredChild()
	return nil
}

// startChildNow writes d: in the execution's next grouped write
// (startChild), else in a transaction of its own (startChildTx); then
// wakes the child's queue.
func (x *execution) startChildNow(d *childStart) {
	if _, ok := x.startChild(d, nil); !ok {
		x.startChildTx(d.name, d.input, &d.so, d.parentClose, d.link, d.key, d.link.position)
	}
	x.childStarted(d)
}

// childStarted follows a committed start of d: the child's queue is woken
// now (bounded: a wake-up lost to a slow server costs the workers' next
// poll, no more), and a child inserted is the future's fresh one.
func (x *execution) childStarted(d *childStart) {
	link := d.link
	if link.wake != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(x.ctx), wakeTimeout)
		link.wake(ctx, x.r.pool)
		cancel()
	}
	if link.jobID != 0 {
		*d.fresh = &freshChild{jobID: link.jobID, run: d.run(link.trace)}
	}
}

// run is the child run as d inserts it.
func (d *childStart) run(trace string) runInfo {
	return runInfo{workflow: d.name, state: string(StatePending), input: string(d.input), queue: d.so.Queue,
		parentID: d.link.runID, trace: trace}
}

// startChild starts child run d.so.ID of workflow d.name, and records its
// checkpoint (waiting at its link's position), in one statement of the
// execution's next write, which goes with the writes of other executions
// (batchWrite): the run, its job and the checkpoint are inserted together
// or not at all (sqlStartChild). With lent, the job is inserted claimed
// with lent's claim where a claim would take it (sqlStartChildClaimed),
// and claimedAt is its attempted_at (nil when it was inserted queued);
// job is the job as inserted. It returns false, having written nothing of
// the child, when it cannot tell what to do alone: the id is taken (by
// this parent's child at this position, which is adopted, or by another
// run, which fails the step), or the start's options are refused; the
// caller then starts the child in a transaction of its own
// (startChildTx), which tells these apart.
func (x *execution) startChild(d *childStart, lent *eager.Lent[*core.JobRow]) (started *startedChild, ok bool) {
	name, link, key, so := d.name, d.link, d.key, d.so
	o, err := startDefaults(name, &so)
	if err != nil || o.mayReplace() || o.ExecutionTimeout != 0 {
		return nil, false
	}
	// The child's root span goes under this one, in the run's trace, as
	// startRun puts it.
	_, span := x.stepSpan("child", key, 1)
	defer span.End()
	ctx, root := x.r.tracer.Start(trace.ContextWithSpan(x.ctx, span), "workflow "+name, trace.WithAttributes(
		attribute.String("relay.workflow.name", name), attribute.String("relay.workflow.run_id", o.ID)))
	defer root.End()
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	traceJSON, _ := json.Marshal(carrier)
	row, err := runJobRow(o, runJobMetadata(o.ID, carrier))
	if err != nil {
		return nil, false
	}
	var job *jobinsert.One
	if lent != nil {
		job, err = jobinsert.BeginFor(ctx, row, lent.TracerProvider, lent.Enqueued)
	} else {
		job, err = jobinsert.Begin(ctx, row)
	}
	if err != nil {
		return nil, false
	}
	var policy any
	if parentClose := d.parentClose; parentClose != ParentCloseCancel {
		policy = parentClose.stored()
	}
	var jobID int64
	var claimedAt *time.Time
	err = x.batchWriteOp(nil, &batchOp{
		queue: func(b *pgx.Batch) {
			if lent == nil {
				b.Queue(sqlStartChild, o.ID, name, string(d.input), o.Queue, link.runID, link.position, string(traceJSON), job.Param(), key, policy)
				return
			}
			b.Queue(sqlStartChildClaimed, o.ID, name, string(d.input), o.Queue, link.runID, link.position, string(traceJSON), job.Param(), key, policy,
				lent.By, lent.Token.String(), lent.LeaseMS)
		},
		read: func(br pgx.BatchResults) error {
			jobID, claimedAt = 0, nil
			var err error
			if lent == nil {
				err = br.QueryRow().Scan(&jobID)
			} else {
				err = br.QueryRow().Scan(&jobID, &claimedAt)
			}
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // the id is taken: nothing of the child written
			}
			return err
		},
	})
	if err != nil {
		job.Done(0, err)
		if lent != nil {
			lent.Release()
		}
		x.writeFailed(err)
	}
	job.Done(jobID, nil)
	if jobID == 0 {
		return nil, false
	}
	x.hist[link.position] = &stepRow{position: link.position, key: key, kind: "child", state: stepWaiting, childID: o.ID}
	link.wake, link.jobID, link.trace = job.Wake, jobID, string(traceJSON)
	return &startedChild{job: job.Row(), claimedAt: claimedAt}, true
}

// startedChild is the job startChild inserted, and its attempted_at when
// it was inserted claimed.
type startedChild struct {
	job       jobinsert.Row
	claimedAt *time.Time
}

// executeChildStart writes d, the start Child deferred to this Get of the
// child, with the child's job inserted already claimed by the core client
// executing this run, for this execution's worker slot
// (eager.Inserter.Lend), and executes the child here, as executeChild
// executes a child it claims: the job is written once, where a start and
// a claim write it twice. It returns the child's sink, or nil when the
// child was not executed here: no client of the registry's lends the slot
// (the start is then written as Child writes it, and executeChild may
// still claim the child), the id is taken (startChildTx), or the job was
// inserted queued (a paused queue, a global limit: it waits for a worker,
// woken now).
func (x *execution) executeChildStart(d *childStart) *eagerSink {
	if x.mayExecuteChild(d.so.Queue) {
		for _, ins := range x.r.eagerInserters() {
			lent, err := ins.Lend(x.ctx, RunKind, d.so.Queue, x.job.JobRow)
			if errors.Is(err, eager.ErrNotWorked) {
				continue // another client of the registry's: not the one executing this run
			}
			if err != nil {
				x.r.logger.Debug("relay: workflow child not inserted claimed for its parent's slot", "run_id", d.so.ID, "parent_run_id", x.runID, "reason", err)
				break
			}
			return x.startClaimedChild(d, lent)
		}
	}
	x.startChildNow(d)
	return nil
}

// startClaimedChild is executeChildStart once lent is reserved.
func (x *execution) startClaimedChild(d *childStart, lent *eager.Lent[*core.JobRow]) *eagerSink {
	started, ok := x.startChild(d, lent)
	if !ok {
		lent.Release()
		x.startChildTx(d.name, d.input, &d.so, d.parentClose, d.link, d.key, d.link.position)
		x.childStarted(d)
		return nil
	}
	if started.claimedAt == nil {
		// Inserted queued, as a claim would leave it: no claim of it here
		// either (executeChild), it would be refused the same way.
		lent.Release()
		d.link.jobID = 0
		x.childStarted(d)
		return nil
	}
	run := d.run(d.link.trace)
	sink := &eagerSink{runID: d.so.ID, run: &run, lendJob: x.job.ID, lendToken: x.job.LeaseToken.String()}
	job := lent.Adopt(context.WithValue(x.ctx, eagerKey{}, sink), d.link.jobID, started.job, *started.claimedAt)
	job.Execute(x.ctx) //nolint:errcheck // the outcome is the child's run's, in sink (or read by Get)
	return sink
}

// startChildTx starts the child in a transaction of the execution's own
// (startRun): it adopts the run that holds the id when it is this
// parent's child at this position, and fails the step (ErrIDInUse) when it
// is another's.
func (x *execution) startChildTx(name string, input []byte, so *StartOpts, parentClose ParentClosePolicy, link *parentLink, key string, pos int) {
	id := so.ID
	x.fenced(func(ctx context.Context, tx pgx.Tx) error {
		// The child's root span goes under this one, in the run's trace;
		// the writes keep the write's own context.
		_, span := x.stepSpan("child", key, 1)
		defer span.End()
		ctx = trace.ContextWithSpan(ctx, span)
		link.wake, link.jobID = nil, 0 // a retried transaction starts it again
		_, _, err := startRun(ctx, tx, x.r.tracer, eager.Producer{}, name, input, so, link)
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
	var sink *eagerSink
	if d := f.start; d != nil && d == x.deferredChild {
		x.deferredChild = nil
		sink = x.executeChildStart(d)
	} else {
		x.startDeferredChild()
	}
	f.start = nil
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
	if sink == nil {
		sink = x.executeChild(f.RunID, f.fresh)
	}
	if sink != nil && sink.done {
		// Executed here to its end: its outcome is the one it recorded.
		f.fresh = nil
		s := &stepRow{position: f.pos, key: h.key, kind: "child", state: stepCompleted, childID: f.RunID}
		if sink.state == StateCompleted {
			s.output = string(sink.output)
		} else {
			s.state, s.errMsg = stepFailed, encodeChildError(&ChildError{RunID: f.RunID, State: sink.state, Message: sink.msg})
		}
		if sink.resumed {
			// Written by the child's end, under this execution's lease
			// (sqlFinishChildRun): if that lease was lost, this
			// execution's next write is refused anyway.
			s.attempts = 1
			x.hist[f.pos] = s
			return decode(s)
		}
		x.later(s)
		if s.state != stepCompleted {
			// This execution wrote nothing while the child ran, so a
			// Cancel of this run (which asked the child too: the likely
			// reason it did not complete) is seen only by a write: the
			// checkpoint commits now, reading the flag, so that the run
			// ends cancelled and not failed by the child's error, as it
			// does when it suspends for a child on its queue.
			x.flush()
		}
		return decode(s)
	}
	f.fresh = nil
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

// executeChild executes child run id, inserted by this execution (fresh)
// and still queued, in this execution's worker slot, which would otherwise
// sit idle while the parent waits for it: the child's job is claimed, as
// the queue's workers would claim it, by the core client executing this
// run (eager.Inserter.Claim), and its first execution runs here, through
// the client's worker path, to its end or its first suspension. It
// returns the child's sink (done when the execution recorded the
// child's end), or nil when the child was not executed here: claimed by
// another worker already, held by a pause or a limit, on another queue
// than the parent's, the parent has an execution timeout, or a cancel of
// the parent is pending (which Get handles first). The child is an ordinary run all the while: a crash
// leaves its job to the rescuer, its outcome wakes the parent as always.
func (x *execution) executeChild(id string, fresh *freshChild) *eagerSink {
	if fresh == nil || !x.mayExecuteChild(fresh.run.queue) {
		return nil
	}
	sink := &eagerSink{runID: id, run: &fresh.run, lendJob: x.job.ID, lendToken: x.job.LeaseToken.String()}
	ctx := context.WithValue(x.ctx, eagerKey{}, sink)
	for _, ins := range x.r.eagerInserters() {
		job, err := ins.Claim(ctx, fresh.jobID, RunKind, fresh.run.queue, x.job.JobRow)
		if errors.Is(err, eager.ErrNotWorked) {
			continue // another client of the registry's: not the one executing this run
		}
		if err != nil {
			x.r.logger.Debug("relay: workflow child not executed in its parent's slot; it runs queued", "run_id", id, "parent_run_id", x.runID, "reason", err)
			return nil
		}
		job.Execute(x.ctx) //nolint:errcheck // the outcome is the child's run's, in sink (or read by Get)
		return sink
	}
	return nil
}

// lender is the parent's job and lease token when this execution runs in
// the slot of the parent's execution waiting for it (executeChild): 0 and
// nil otherwise.
func (x *execution) lender() (int64, any) {
	if s, ok := x.ctx.Value(eagerKey{}).(*eagerSink); ok && s.runID == x.runID && s.lendJob != 0 {
		return s.lendJob, s.lendToken
	}
	return 0, nil
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
