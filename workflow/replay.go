package workflow

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
	"github.com/relayq/relay/internal/wfhook"
)

// Context is what a workflow function receives: a context.Context (for
// the function's own calls; cancelled when the execution loses its lease)
// and the run's replay state, which Step, Sleep, WaitSignal and the other
// primitives of this package use. Pass it on; do not keep it beyond the
// function's return, and do not use it from other goroutines: a primitive
// called from one is refused with ErrForeignGoroutine and fails the run
// (Go runs steps in parallel).
type Context struct {
	context.Context
	x *execution
}

// RunID is the id of the run being executed.
func (c Context) RunID() string { return c.x.runID }

// Workflow is the name of the run's workflow.
func (c Context) Workflow() string { return c.x.run.workflow }

// unregisteredDelay is how long a run of a workflow this process does not
// know waits before it is executed again (by any process).
const unregisteredDelay = 15 * time.Second

// failReserve is how many attempts a run's job has beyond the run's
// MaxAttempts, to record the run's failure: the execution that fails a
// crash-looping run may crash too (the same fault), and a job whose
// attempts are used up dies, leaving its run unfinished for good.
const failReserve = 3

// maxSuspend bounds a suspension with no deadline (a wait for a child or a
// signal without timeout): the wake-up normally comes first, and this poll
// only covers a lost one.
const maxSuspend = time.Hour

// stepRow is one checkpoint of a run's history.
type stepRow struct {
	position int
	key      string
	kind     string
	state    string
	output   string
	errMsg   string
	// errInfo is a failed step's error description (describeError).
	errInfo  string
	attempts int
	wakeAt   *time.Time
	childID  string
	// attempt is the step attempt this write adds to the step's attempt
	// log (nil: none). Not loaded with history.
	attempt *StepAttempt
	// startedAt is when the step's first attempt began, on the database's
	// clock (its row's started_at; a write creating the row sets it, nil
	// for the write's now()).
	startedAt *time.Time
}

// Step states.
const (
	stepCompleted = "completed"
	stepFailed    = "failed"
	stepRetrying  = "retrying"
	stepWaiting   = "waiting"
)

// runInfo is what an execution reads of its run.
type runInfo struct {
	workflow, state, input, queue, parentID, trace string
	cancelRequested                                bool
	generation                                     int
	// executions is how many executions of the run wrote something before
	// this one: this one is number executions+1.
	executions int
	jobID      int64 // the job that executes the run now
	// deadline is when the run's execution timeout passes (database
	// clock), nil for none.
	deadline *time.Time
}

// execution is one execution of a run: the function called from the top,
// replaying its history.
type execution struct {
	r     *Registry
	job   *core.Job[runArgs]
	runID string
	run   runInfo
	def   *definition
	now   time.Time // the database's clock when the execution began
	// began is when the execution began on this process's monotonic
	// clock: now plus time.Since(began) is the database's clock of the
	// moment, as near as a deadline needs (dbNow).
	began time.Time
	hist  map[int]*stepRow
	// keep is the part of the history as loaded that the registry keeps
	// if the execution suspends (see histCache).
	keep  []stepRow
	pos   int
	keys  map[string]int
	comps []compensation
	// cancelling: a cancel was asked for; new steps unwind to the
	// compensations. compensating: they are running (steps may run).
	cancelling, compensating bool
	// touched: this execution's first write has marked the run started.
	touched bool
	// finWrote: the run's outcome statement updated its row (a root
	// run's outcome written by batchWrite or in finish's transaction),
	// so the outcome is the one the run now holds.
	finWrote bool
	// cancelRead is the cancel flag as the write in progress read it,
	// before its fn (writeTx).
	cancelRead bool
	// retryFrom is the position of the step whose error the function
	// returned, recorded with the run's failure (sqlRetryDropSteps).
	retryFrom *int
	// pending holds completed checkpoints not yet written (see later).
	pending []*stepRow
	// deferredChild is a child's start that Child deferred to the
	// execution's next primitive (see Child), nil for none.
	deferredChild *childStart
	// dueWaits are sleeps found due, marked completed by the next write.
	dueWaits  []int
	setState  RunState
	waitSeq   map[string]int
	eventSeq  map[string]int
	tagSeq    int             // AddTags calls so far
	patches   map[string]bool // Patch's answer by name
	ctx       context.Context
	unwinding *unwind
	// goroutines are the steps started by Go; cancels end them when the
	// execution ends.
	goroutines sync.WaitGroup
	cancels    []func()
	// goroutine is the id of the goroutine executing the run: the only one
	// its primitives may be called from (enter); misused is the first call
	// from another.
	goroutine uint64
	misused   atomic.Pointer[misuse]
	// hooks are the test environment's (internal/wfhook), nil in
	// production.
	hooks *wfhook.Hooks
	// dryRun: a replay of an exported history (Replay), which runs
	// nothing and writes nothing; it ends at the first position history
	// does not hold settled.
	dryRun bool
	// inStep is the key of the step whose function runs on the run's
	// goroutine at the moment ("" for none): primitives are refused
	// there (enter).
	inStep string
}

// unwind ends a workflow function early, carried by a panic from the
// primitive that decided it to execute.
type unwind struct {
	kind  unwindKind
	delay time.Duration
	err   error
}

type unwindKind int

const (
	unwindSuspend   unwindKind = iota // come back after delay (core.Snooze)
	unwindAbort                       // the execution failed (database error): core retries it
	unwindLost                        // the lease is gone: record nothing more
	unwindFatal                       // the run fails, without compensation
	unwindCancel                      // a cancel was asked for: compensate
	unwindReplayEnd                   // a dry run reached the end of the settled history
	unwindTimeout                     // the run's execution timeout passed: compensate, fail
)

// fatalError fails a run at once, without compensation (non-determinism,
// a duplicate key, an output that does not encode).
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

func (x *execution) stop(u *unwind) {
	x.unwinding = u
	panic(u)
}

func (x *execution) suspend(d time.Duration) {
	if x.run.deadline != nil && !x.compensating {
		// The run's execution timeout ends every wait: the run comes back
		// at its deadline and fails there (checkDeadline).
		d = min(d, x.run.deadline.Sub(x.dbNow()))
	}
	x.stop(&unwind{kind: unwindSuspend, delay: max(d, 0)})
}

func (x *execution) fatal(err error) { x.stop(&unwind{kind: unwindFatal, err: err}) }

// checkCancel unwinds to the compensations when a cancel was asked for and
// the run is about to do something new.
func (x *execution) checkCancel() {
	if x.cancelling && !x.compensating {
		x.stop(&unwind{kind: unwindCancel})
	}
	x.checkDeadline()
}

// next places the step kind:key at the next position of the run, and
// returns what history holds there (nil when it is new). A key used twice
// in a run and a key other than history's are fatal.
func (x *execution) next(kind, key string) (int, *stepRow) {
	if key == "" {
		x.fatal(fmt.Errorf("workflow: run %s: empty %s key", x.runID, kind))
	}
	if prev, dup := x.keys[key]; dup {
		x.fatal(fmt.Errorf("%w: %q in run %s at positions %d and %d", ErrDuplicateKey, key, x.runID, prev, x.pos))
	}
	pos := x.pos
	x.pos++
	x.keys[key] = pos
	h := x.hist[pos]
	if h != nil && (h.key != key || h.kind != kind) {
		x.fatal(&NonDeterminismError{RunID: x.runID, Position: pos, HistoryKey: h.kind + ":" + h.key, CodeKey: kind + ":" + key})
	}
	if h != nil && h.state != stepCompleted && h.state != stepFailed && h.state != stepRetrying && h.state != stepWaiting {
		// No code writes another state (a row written by hand): treated
		// as not done, the step would run again, a StepTx's writes with it.
		x.fatal(fmt.Errorf("workflow: run %s: step %q at position %d is stored in state %q, which is none of a step's states (completed, failed, retrying, waiting)", x.runID, key, pos, h.state))
	}
	if x.dryRun && (h == nil || (h.state != stepCompleted && h.state != stepFailed)) {
		// Past here the code would run or wait for something new.
		x.stop(&unwind{kind: unwindReplayEnd})
	}
	if h == nil && kind != "step" && kind != "tx" {
		// A simulated crash before a new sleep, wait, child or value (a
		// step's is in runStep, before its function).
		x.crashAt(key, wfhook.BeforeStep)
	}
	if h != nil {
		x.r.stats.replayed.Add(1)
	}
	return pos, h
}

// load reads the run and, when history, its history: two statements in
// one round trip, the history in one query however many steps it holds.
// Without history the execution starts from an empty one. Of a run this
// registry suspended, it reads only the steps it does not keep (see
// histCache), unless the run is no longer the one they were kept for.
func (x *execution) load(ctx context.Context, history bool) error {
	var kept *keptHistory
	from := 0
	if history {
		if kept = x.r.histories.take(x.runID); kept != nil {
			from = len(kept.steps)
		}
	}
	b := &pgx.Batch{}
	b.Queue(sqlLoadRun, x.runID)
	if history {
		b.Queue(sqlLoadSteps, x.runID, from)
	}
	br := x.r.pool.SendBatch(ctx, b)
	defer br.Close()
	i := &x.run
	err := br.QueryRow().Scan(&i.workflow, &i.state, &i.input, &i.queue, &i.parentID, &i.trace, &i.cancelRequested, &i.generation, &i.executions, &i.jobID, &x.now, &i.deadline)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrRunNotFound
	}
	if err != nil {
		return fmt.Errorf("workflow: load run %s: %w", x.runID, err)
	}
	x.hist = map[int]*stepRow{}
	if !history {
		return nil
	}
	if kept != nil && !kept.fits(&x.run) {
		// Its history changed: read all of it.
		kept = nil
		if err := br.Close(); err != nil {
			return fmt.Errorf("workflow: load steps of run %s: %w", x.runID, err)
		}
		if err := x.loadSteps(x.r.pool.Query(ctx, sqlLoadSteps, x.runID, 0)); err != nil {
			return err
		}
	} else if err := x.loadSteps(br.Query()); err != nil {
		return err
	}
	var known []stepRow
	if kept != nil {
		known = kept.steps
		steps := slices.Clone(known) // the execution's own, which it may change
		for i := range steps {
			x.hist[i] = &steps[i]
		}
	}
	if len(x.hist) >= histCacheMinSteps {
		x.keep = unchangingPrefix(known, x.hist)
	}
	return nil
}

// loadSteps adds the steps of rows (sqlLoadSteps) to x.hist.
func (x *execution) loadSteps(rows pgx.Rows, err error) error {
	if err != nil {
		return fmt.Errorf("workflow: load steps of run %s: %w", x.runID, err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		s := &stepRow{}
		if err := rows.Scan(&s.position, &s.key, &s.kind, &s.state, &s.output, &s.errMsg, &s.attempts, &s.wakeAt, &s.childID, &s.errInfo, &s.startedAt); err != nil {
			return fmt.Errorf("workflow: load steps of run %s: %w", x.runID, err)
		}
		x.hist[s.position] = s
		n++
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("workflow: load steps of run %s: %w", x.runID, err)
	}
	x.r.stats.historyRead.Add(int64(n))
	return nil
}

// execute runs one execution of a run: the core job's handler.
func (r *Registry) execute(ctx context.Context, job *core.Job[runArgs]) error {
	r.stats.executions.Add(1)
	x := &execution{r: r, job: job, runID: job.Args.RunID, keys: map[string]int{}, waitSeq: map[string]int{}, eventSeq: map[string]int{}, patches: map[string]bool{},
		goroutine: goroutineID(), hooks: wfhook.From(ctx), began: time.Now()}
	if err := x.loadOrEager(ctx); err != nil {
		if errors.Is(err, ErrRunNotFound) {
			r.logger.Warn("relay: workflow run not found; its job ends", "run_id", x.runID, "job_id", job.ID)
			return nil
		}
		return err
	}
	if RunState(x.run.state).Final() {
		return nil
	}
	if x.run.jobID != job.ID {
		// A job left behind: the run was retried, or deleted and its id
		// started again, while this job waited to be rescued. The run has a
		// job of its own now, whose lease fences its executions; executing
		// it here too would be a second execution under another lease. A
		// run's job changes only while the run is final (Retry, a new
		// Start), which this load would have seen, so checking here is
		// enough.
		r.logger.Warn("relay: workflow run is executed by another job; this one ends", "run_id", x.runID, "job_id", job.ID, "run_job_id", x.run.jobID)
		return nil
	}
	x.cancelling = x.run.cancelRequested
	ctx = rootContext(ctx, x.run.trace)
	ctx, span := r.tracer.Start(ctx, "workflow.execute "+x.run.workflow, trace.WithAttributes(
		attribute.String("relay.workflow.name", x.run.workflow),
		attribute.String("relay.workflow.run_id", x.runID),
		attribute.Int("relay.workflow.generation", x.run.generation),
		attribute.Int("relay.workflow.execution", x.run.executions+1),
		attribute.Int("relay.job.attempt", job.Attempt)))
	x.ctx = ctx
	err := x.main()
	x.endGoroutines()
	switch {
	case err == nil:
		endSpan(span, nil, attribute.String("relay.workflow.outcome", "finished"))
	case errors.Is(err, errSuspended):
		endSpan(span, nil, attribute.String("relay.workflow.outcome", "suspended"))
		if x.keep != nil {
			executions := x.run.executions
			if x.touched {
				executions++
			}
			r.histories.put(x.runID, &keptHistory{jobID: x.run.jobID, generation: x.run.generation, executions: executions, steps: x.keep})
		}
	default:
		endSpan(span, err, attribute.String("relay.workflow.outcome", "failed"))
	}
	return err
}

// errSuspended marks the Snooze an execution returns when it suspends.
var errSuspended = errors.New("workflow: run suspended")

type suspendedError struct{ snooze error }

func (e *suspendedError) Error() string   { return e.snooze.Error() }
func (e *suspendedError) Unwrap() []error { return []error{e.snooze, errSuspended} }

// main calls the function and records what came of it.
func (x *execution) main() error {
	job := x.job
	if job.Attempt > 1 && job.Attempt > job.MaxAttempts-failReserve {
		// Every earlier attempt of this job crashed or failed (suspensions
		// are not attempts), as many as StartOpts.MaxAttempts: stop here
		// rather than crash-loop (the job has failReserve attempts more for
		// this, so an execution failing the run may crash too).
		// The claim does not carry the job's last error: read it.
		var last string
		if err := x.r.pool.QueryRow(x.ctx, sqlJobLastError, job.ID).Scan(&last); err != nil {
			last = "unknown: " + err.Error()
		}
		return x.finish(StateFailed, nil, fmt.Sprintf("workflow: run %s: %d executions crashed or failed (last: %s)", x.runID, job.Attempt-1, last))
	}
	x.def = x.r.byName[x.run.workflow]
	if fake := x.fakeWorkflow(); fake != nil {
		x.def = fake
	}
	if x.def == nil {
		// A rolling deploy: newer code started this run. Put it back for
		// a process that knows the workflow, without spending an attempt
		// (an error would fail the run after MaxAttempts tries).
		x.r.logger.Warn("relay: workflow run of a workflow not registered in this process; put back for another process",
			"run_id", x.runID, "workflow", x.run.workflow, "retry_in", unregisteredDelay)
		return &suspendedError{core.Snooze(unregisteredDelay)}
	}
	out, err, u := x.call()
	if u == nil {
		u = x.unwinding // the function recovered our panic: it still ends here
	}
	if u == nil || u.kind != unwindLost {
		// A child started last, its Get never called: written before
		// whatever comes of the function's end, as Child would have.
		if su := x.settleDeferredChild(); su != nil {
			return x.unwound(su, nil)
		}
	}
	if m := x.misused.Load(); m != nil && (u == nil || u.kind != unwindLost) {
		// A primitive was called from another goroutine: whatever the
		// function did after, the code is wrong; nothing of that call was
		// recorded, and the run fails loudly rather than end on a history
		// that misses what the code asked for.
		return x.finish(StateFailed, nil, m.err.Error())
	}
	if u != nil {
		return x.unwound(u, err)
	}
	if err != nil && x.ctx.Err() != nil {
		return x.interrupted(err)
	}
	var fe *fatalError
	switch {
	case err == nil && x.cancelling:
		// A cancel seen by a write after the last step ran: it wins over
		// the output (the compensations run past the function's end, at
		// the same positions on every replay).
		return x.compensate(StateCancelled, cancelledMsg)
	case err == nil:
		if nd := x.unreached(); nd != nil {
			return x.finish(StateFailed, nil, nd.Error())
		}
		err := x.finish(StateCompleted, out, "")
		if errors.Is(err, errCancelWins) {
			x.cancelling = true
			return x.compensate(StateCancelled, cancelledMsg)
		}
		return err
	case errors.As(err, &fe):
		return x.finish(StateFailed, nil, err.Error())
	case x.cancelling:
		return x.compensate(StateCancelled, cancelledMsg+" (the function returned: "+err.Error()+")")
	}
	x.retryFrom = x.failurePoint(err)
	return x.compensate(StateFailed, err.Error())
}

// cancelledMsg is the error of a cancelled run.
const cancelledMsg = "cancelled"

// errCancelWins: the run's completion (or compensated end) was not
// recorded because a cancel is requested (sqlFinishRun); the execution
// compensates instead (or, its compensations run, ends the run cancelled).
var errCancelWins = errors.New("workflow: completion not recorded: a cancel is requested")

// cancelRefuses reports whether a requested cancel refuses an outcome of
// state: completed, and compensated (a cancel that arrives while a failed
// run compensates ends it cancelled once its compensations ran).
func cancelRefuses(state RunState) bool {
	return state == StateCompleted || state == StateCompensated
}

// failurePoint is the position of the failed step whose error err is (or
// wraps): a step's *StepError, or a child's *ChildError. nil when err is
// the function's own: Retry then runs no step again.
func (x *execution) failurePoint(err error) *int {
	var se *StepError
	if errors.As(err, &se) && se.RunID == x.runID {
		if pos, ok := x.keys[se.Key]; ok {
			if h := x.hist[pos]; h != nil && h.key == se.Key && h.state == stepFailed {
				return &pos
			}
		}
	}
	var ce *ChildError
	if errors.As(err, &ce) {
		for pos, h := range x.hist {
			if h.kind == "child" && h.childID == ce.RunID && h.state == stepFailed {
				return &pos
			}
		}
	}
	return nil
}

// unreached returns the non-determinism of a function that returned while
// history holds steps past the point it returned at (a step removed from
// the end, a branch on something not recorded): they were done, and the
// code no longer asks for them.
func (x *execution) unreached() *NonDeterminismError {
	first := -1
	for pos := range x.hist {
		if pos >= x.pos && (first < 0 || pos < first) {
			first = pos
		}
	}
	if first < 0 {
		return nil
	}
	h := x.hist[first]
	return &NonDeterminismError{RunID: x.runID, Position: first, HistoryKey: h.kind + ":" + h.key, CodeKey: "(return)"}
}

func (x *execution) unwound(u *unwind, err error) error {
	switch u.kind {
	case unwindSuspend:
		if len(x.pending) > 0 {
			if err := x.batchWrite(nil); err != nil {
				return fmt.Errorf("workflow: run %s: checkpoint before suspending: %w", x.runID, err)
			}
		}
		x.r.stats.suspended.Add(1)
		return &suspendedError{core.Snooze(u.delay)}
	case unwindLost:
		return fmt.Errorf("workflow: run %s: %w", x.runID, u.err)
	case unwindFatal:
		return x.finish(StateFailed, nil, u.err.Error())
	case unwindCancel:
		return x.compensate(StateCancelled, cancelledMsg)
	case unwindTimeout:
		return x.compensate(StateFailed, u.err.Error())
	}
	return u.err
}

// call runs the workflow function, catching the unwinds of the primitives
// and turning a panic of its own into an error.
func (x *execution) call() (out []byte, err error, u *unwind) {
	defer func() {
		if p := recover(); p != nil {
			if uw, ok := p.(*unwind); ok {
				u = uw
				return
			}
			err = fmt.Errorf("workflow: %s run %s panicked: %v\n%s", x.run.workflow, x.runID, p, debug.Stack())
		}
	}()
	out, err = x.def.call(Context{Context: x.ctx, x: x}, []byte(x.run.input))
	return out, err, nil
}

// finish records the run's outcome, wakes its parent and the callers
// waiting on Result, fenced by the run job's lease. A child's end and its
// parent's wake-up are one transaction (with its job's success too,
// core.CompleteTx, when it closes children of its own).
func (x *execution) finish(state RunState, output []byte, msg string) error {
	msg = boundError(msg) // a handler's 10 MB error is not stored whole
	if msg == "" && state != StateCompleted {
		// Every run that ends otherwise than completed has an error: the
		// admin API finds them by it (relay_workflow_runs_error_idx).
		msg = fmt.Sprintf("workflow: run %s ended %s", x.runID, state)
	}
	var out any
	if output != nil {
		out = string(output)
	}
	var from any // where Retry resumes: only a run failed by a step's error has one
	if state == StateFailed && x.retryFrom != nil {
		from = *x.retryFrom
	}
	// A run cancels its unfinished children in the transaction that
	// records its end, whatever the end (docs/workflow.md, child runs): a
	// child started and never collected does not outlive its parent. A
	// cancelled run asks whatever its history holds: one started while the
	// cancel was being asked for (after this execution last read the flag)
	// is cancelled too.
	closeChildren := state == StateCancelled || x.openChildren()
	cancelChildren := func(ctx context.Context, tx pgx.Tx) error {
		if !closeChildren {
			return nil
		}
		if err := terminateChildren(ctx, tx, x.runID); err != nil {
			return err
		}
		_, err := requestCancel(ctx, dbx.PGX{Q: tx}, x.runID)
		return err
	}
	var err error
	switch {
	case !closeChildren:
		// Its outcome (and a child's wake-up of its parent,
		// sqlFinishChildRun) commits in one round trip under the lease,
		// with the writes of other executions; the job's success is then
		// recorded by the core, as any job's (a crash in between
		// re-executes the run, which finds it finished and ends).
		err = x.batchWrite(&outcome{state: state, output: out, msg: msg, retryFrom: from})
	case x.run.parentID == "":
		err = x.write(func(ctx context.Context, tx pgx.Tx) error {
			ct, err := tx.Exec(ctx, sqlFinishRootRun, x.runID, string(state), out, msg, from, 0) // touched by the write's bookkeeping
			if err != nil {
				return fmt.Errorf("finish run: %w", err)
			}
			x.finWrote = ct.RowsAffected() == 1
			if ct.RowsAffected() == 0 && cancelRefuses(state) {
				return errCancelWins
			}
			return cancelChildren(ctx, tx)
		})
	default:
		err = x.writeTx(func(ctx context.Context, tx pgx.Tx) error {
			var parentJob int64
			err := tx.QueryRow(ctx, sqlFinishRun, x.runID, string(state), out, msg, from).Scan(&parentJob)
			switch {
			case errors.Is(err, pgx.ErrNoRows) && cancelRefuses(state):
				return errCancelWins // rolls back: the job is not completed
			case err != nil && !errors.Is(err, pgx.ErrNoRows):
				return fmt.Errorf("finish run: %w", err)
			}
			if err := cancelChildren(ctx, tx); err != nil {
				return err
			}
			// The parent wakes in the transaction that records the child's
			// end, never waiting for its job's row (sqlWakeParent).
			if parentJob != 0 {
				if _, err := tx.Exec(ctx, sqlWakeParent, parentJob); err != nil {
					return fmt.Errorf("wake parent job %d: %w", parentJob, err)
				}
			}
			if _, err := tx.Exec(ctx, sqlNotifyDone, x.runID); err != nil {
				return err
			}
			return core.CompleteTx(ctx, tx, x.job)
		}, false)
	}
	if err != nil {
		return fmt.Errorf("workflow: run %s: record outcome %s: %w", x.runID, state, err)
	}
	if x.run.parentID == "" || !closeChildren {
		// Callers waiting here get the outcome as written, at once
		// (waiter.deliver); other processes' are notified. A child
		// closing its children wakes its callers in its outcome's
		// transaction, which notifies anyway (its parent's wake-up).
		if x.finWrote {
			x.r.waiter.deliver(x.runID, &finished{workflow: x.run.workflow, state: state, output: output, msg: msg})
		}
		x.r.announcer.announce(x.r.pool, x.runID)
	}
	x.r.stats.finished.Add(1)
	x.logOutcome(state, msg)
	// sqlFinishChildRun wrote the checkpoint of a completed child for the
	// parent's execution that waits for it in this slot (or that
	// execution lost its lease, and records nothing more).
	lendJob, _ := x.lender()
	resumed := !closeChildren && x.run.parentID != "" && lendJob != 0 && state == StateCompleted
	eagerFinished(x.ctx, x.runID, state, output, msg, resumed)
	return nil
}

// logOutcome logs, at warn, a run that ended otherwise than completed
// (failed, compensated or cancelled), once its outcome has committed: the
// run, its workflow, its job, its parent (a child run's) and its error
// (bounded as a step attempt's).
func (x *execution) logOutcome(state RunState, msg string) {
	if state == StateCompleted {
		return
	}
	attrs := []any{"run_id", x.runID, "workflow", x.run.workflow, "state", string(state), "job_id", x.job.ID}
	if x.run.parentID != "" {
		attrs = append(attrs, "parent_run_id", x.run.parentID)
	}
	x.r.logger.Warn("relay: workflow run ended "+string(state), append(attrs, "error", boundText(msg, maxAttemptErrorBytes))...)
}

// stepSpan starts the span of one attempt of a step, under the execution's.
// The context carries the step's idempotency key (StepIdempotencyKey).
func (x *execution) stepSpan(kind, key string, attempt int) (context.Context, trace.Span) {
	ctx := context.WithValue(x.ctx, stepKeyCtx{}, x.stepIdempotencyKey(key))
	return x.r.tracer.Start(ctx, "workflow."+kind+" "+key, trace.WithAttributes(
		attribute.String("relay.workflow.run_id", x.runID),
		attribute.String("relay.workflow.step", key),
		attribute.Int("relay.workflow.position", x.pos-1),
		attribute.Int("relay.workflow.step.attempt", attempt)))
}

// endGoroutines cancels the steps started by Go that were never collected
// and waits, a bounded time, for them to return.
func (x *execution) endGoroutines() {
	if len(x.cancels) == 0 {
		return
	}
	for _, cancel := range x.cancels {
		cancel()
	}
	done := make(chan struct{})
	go func() { x.goroutines.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		x.r.logger.Warn("relay: steps started by workflow.Go ignore their cancelled context; leaving them running", "run_id", x.runID)
	}
}
