package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/wfhook"
)

// StepOpts tune a step. The zero value (or nil) means: 20 attempts, backoff
// from 1s doubling to 5m (about an hour of retrying in all), no timeout.
type StepOpts struct {
	// MaxAttempts is how many times the step may run before its error is
	// returned to the workflow. 1 means no retry. Default 20: with the
	// default backoff, a step rides out about an hour of a provider's
	// failures before the workflow sees its error (docs/workflow.md, step
	// retries). Negative is an error.
	MaxAttempts int
	// Retry picks the delay before the next attempt. Default
	// core.Backoff{Base: time.Second, Max: 5 * time.Minute}. An error
	// wrapped by core.Permanent is not retried; core.RetryIn picks its delay.
	Retry core.RetryPolicy
	// Timeout bounds each attempt. Past it the attempt fails with
	// ErrStepTimeout (and is retried per Retry and MaxAttempts) even if
	// the step's function ignores its context, whose deadline it is; what
	// the function returns later is discarded, never checkpointed. The
	// function then runs on a goroutine of its own, from which this
	// package's primitives are refused (ErrForeignGoroutine). 0 is none.
	Timeout time.Duration
	// ScheduleToClose bounds all the step's attempts together, retry
	// delays included, from its first attempt's start (on the database's
	// clock, kept in the step's row): each attempt's timeout is at most
	// what is left, no retry is scheduled past it, and the step then fails
	// with an error matching ErrStepTimeout (and wrapping the last
	// attempt's). 0 is none.
	ScheduleToClose time.Duration
	// HeartbeatTimeout fails an attempt whose function has not called
	// Heartbeat for this long (from its start, then from each heartbeat):
	// a step stuck early in a long run is retried without waiting for its
	// Timeout. Its error matches ErrHeartbeatTimeout and ErrStepTimeout;
	// the function then runs as with Timeout, on a goroutine of its own,
	// its context ending at the lapse. 0 is none.
	HeartbeatTimeout time.Duration
}

// defaultStepAttempts is StepOpts.MaxAttempts' default. Temporal retries
// an activity without limit by default, DBOS not at all; three attempts
// (this package's earlier default) failed 2.7 % of runs against a
// provider failing 30 % of calls. Twenty, with the backoff doubling from
// 1 s to 5 min, spans about an hour: a flaky provider or a short outage
// is ridden out (0.3^20 of runs fail), and a step broken for good still
// fails its run, and runs its compensations, within the hour.
const defaultStepAttempts = 20

var defaultStepRetry = core.Backoff{Base: time.Second, Max: 5 * time.Minute}

// validate refuses options out of range (ErrBadOptions).
func (o *StepOpts) validate() error {
	switch {
	case o.MaxAttempts < 0:
		return fmt.Errorf("%w: StepOpts.MaxAttempts is %d (0 is the default, 1 no retry)", ErrBadOptions, o.MaxAttempts)
	case o.Timeout < 0:
		return fmt.Errorf("%w: StepOpts.Timeout is %s (0 is none)", ErrBadOptions, o.Timeout)
	case o.ScheduleToClose < 0:
		return fmt.Errorf("%w: StepOpts.ScheduleToClose is %s (0 is none)", ErrBadOptions, o.ScheduleToClose)
	case o.HeartbeatTimeout < 0:
		return fmt.Errorf("%w: StepOpts.HeartbeatTimeout is %s (0 is none)", ErrBadOptions, o.HeartbeatTimeout)
	}
	return nil
}

// Step runs fn as the step key of the run, once: its output is
// checkpointed (as JSON), and replays of the run return the stored output
// without calling fn again. fn runs inline in the execution, at least once:
// if the process dies after fn and before the checkpoint commits, fn runs
// again, so its outside effects should be idempotent (pass it a key; use
// StepTx for database writes).
//
// A failed attempt with attempts left ends the execution and the run comes
// back after the retry delay (no attempt of the run is spent); the step's
// attempts and last error are kept in its row. When the attempts are used
// up, or for core.Permanent or an *Error marked NonRetryable, Step returns
// a *StepError, on this execution and every replay, the same error on
// each (see StepError).
//
// key identifies the step in the run's history: unique within the run and
// the same on every replay (see docs/workflow.md, determinism).
func Step[T any](wctx Context, key string, fn func(ctx context.Context) (T, error), opts *StepOpts) (T, error) {
	if err := wctx.x.enter("Step"); err != nil {
		var zero T
		return zero, err
	}
	wctx.x.userKey("step", key)
	return step(wctx, key, fn, opts)
}

// step is Step without the check of a user's key: compensations run
// through it under their generated keys.
func step[T any](wctx Context, key string, fn func(ctx context.Context) (T, error), opts *StepOpts) (T, error) {
	x := wctx.x
	return runStep(wctx, "step", key, opts, func(ctx context.Context, p stepPlan) (T, []byte, error, bool) {
		fn := fakeStep(x, key, fn)
		out, err := timed(x, ctx, p, func(ctx context.Context, _ *gate) (T, error) { return callStep(ctx, fn) })
		if err != nil {
			return out, nil, err, false
		}
		enc, err := encode("output of step "+key, out)
		if err != nil {
			return out, nil, core.Permanent(err), false
		}
		return out, enc, nil, false
	})
}

// StepTx runs fn as the step key in a transaction that also commits the
// step's checkpoint, fenced by the run's lease: fn's database writes in tx
// happen exactly once, even across crashes, pauses and rescues (the twin of
// core.CompleteTx). If fn fails, tx rolls back and the step is retried as
// Step's. fn must not commit or roll back tx. An attempt past
// StepOpts.Timeout fails at the timeout; its transaction, still fn's, is
// rolled back when fn returns, never committed.
func StepTx[T any](wctx Context, key string, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts *StepOpts) (T, error) {
	x := wctx.x
	if err := x.enter("StepTx"); err != nil {
		var zero T
		return zero, err
	}
	x.userKey("tx", key)
	return runStep(wctx, "tx", key, opts, func(ctx context.Context, p stepPlan) (T, []byte, error, bool) {
		if p.timeout > 0 {
			// An attempt past its timeout leaves its transaction open
			// until fn returns: it must hold no lock of the execution's
			// own (the run's row, deferred checkpoints), which the
			// execution's next writes take. Those go first, alone.
			x.settleBookkeeping()
			x.checkCancel() // that write read the cancel flag
		}
		// The write's bookkeeping, and what the transaction needs of the
		// execution's state, are read here, on the execution's goroutine,
		// whatever runs the transaction.
		b := x.bookkeeping()
		compensating := x.compensating
		type txResult struct {
			out     T
			userErr error
			cancel  bool // the cancel flag as the transaction began
			late    bool // a cancel asked for while fn ran
			fnDone  bool // fn returned its output: what fails after is the checkpoint's, the fence's or the commit's
			err     error
		}
		res, err := timed(x, ctx, p, func(ctx context.Context, g *gate) (txResult, error) {
			var r txResult
			r.cancel, r.err = x.runWrite(b, func(txCtx context.Context, tx pgx.Tx, cancel bool) error {
				if cancel && !compensating {
					return errCancelSeen // this transaction saw a cancel: the step does not start
				}
				began := x.clock()
				out, err := callStep(ctx, fakeStep(x, key, func(ctx context.Context) (T, error) { return fn(ctx, tx) }))
				if err != nil {
					r.userErr = err
					return err
				}
				r.fnDone = true
				enc, err := encode("output of step "+key, out)
				if err != nil {
					r.userErr = core.Permanent(err)
					return r.userErr
				}
				if !g.commit() {
					return errAttemptAbandoned // past its timeout: rolled back
				}
				// From here the execution waits for this transaction's
				// outcome (the gate), so the checkpoint may update its
				// history.
				r.out = out
				if _, err = x.upsert(ctx, tx, &stepRow{position: p.pos, key: key, kind: "tx", state: stepCompleted, output: string(enc),
					attempt: newAttempt(p.n, began, x.clock(), nil)}, 1, nil, 0); err != nil {
					return err
				}
				// A cancel asked for while fn ran stops the next step.
				if err := tx.QueryRow(txCtx, sqlCancelRequested, x.runID).Scan(&r.late); err != nil {
					return fmt.Errorf("read cancel flag: %w", err)
				}
				return nil
			}, true)
			var pgErr *pgconn.PgError
			if r.err != nil && r.fnDone && !errors.Is(r.err, core.ErrLeaseLost) && errors.As(r.err, &pgErr) {
				// The server refused the transaction after fn returned (a
				// deferred check of the user's own data at the commit, or
				// the transaction ended for idling past
				// idle_in_transaction_session_timeout while fn did
				// something else): it rolled back whole, so the attempt
				// failed as if fn had returned the error, and is the
				// step's to retry or return. An error without the
				// server's word (a connection lost) leaves the outcome
				// unknown: the execution ends, and the next one reads
				// whether the checkpoint committed.
				r.userErr = fmt.Errorf("commit: %w", r.err)
			}
			return r, nil
		})
		if err != nil {
			return res.out, nil, err, false // timed out
		}
		err = x.wrote(res.cancel, res.err)
		switch {
		case err == nil:
			x.cancelling = x.cancelling || res.late
			return res.out, nil, nil, true
		case errors.Is(err, errCancelSeen):
			x.cancelling = true
			x.checkCancel()
		case res.userErr != nil:
			return res.out, nil, res.userErr, false
		case errors.Is(err, core.ErrLeaseLost):
			x.stop(&unwind{kind: unwindLost, err: err})
		}
		x.stop(&unwind{kind: unwindAbort, err: fmt.Errorf("workflow: run %s: step %q: %w", x.runID, key, err)})
		return res.out, nil, nil, false
	})
}

// errCancelSeen: a StepTx's transaction read a requested cancel before
// calling the step's function, and rolled back.
var errCancelSeen = errors.New("workflow: a cancel is requested")

// runStep is the replay and retry logic shared by Step and StepTx. attempt
// runs the step once and returns its output, its encoding (to checkpoint)
// or its error, and whether it checkpointed itself.
func runStep[T any](wctx Context, kind, key string, opts *StepOpts, attempt func(ctx context.Context, p stepPlan) (T, []byte, error, bool)) (T, error) {
	x := wctx.x
	p, out, err, done := planStep[T](x, kind, key, opts)
	if done {
		return out, err
	}
	if kind != "tx" {
		x.flush()       // StepTx writes the deferred checkpoints in its own transaction
		x.checkCancel() // the flush read the cancel flag: none starts after one
	}
	x.crashAt(key, wfhook.BeforeStep)
	ctx, span := x.stepSpan(kind, key, p.n)
	ctx = withBeat(ctx, x, p)
	began := x.clock()
	var enc []byte
	var recorded bool
	if p.expired != nil {
		err = permanent(p.expired) // past ScheduleToClose: no attempt starts
	} else {
		out, enc, err, recorded = attempt(ctx, p)
	}
	endSpan(span, err)
	return settleStep(x, p, began, x.clock(), out, enc, err, recorded)
}

// stepPlan is a step about to run: its place and its retry policy.
type stepPlan struct {
	kind, key   string
	pos, n      int // n: the number of this attempt
	maxAttempts int
	policy      core.RetryPolicy
	timeout     time.Duration
	// scheduled is when the step's first attempt began (database clock);
	// scheduleToClose bounds all its attempts from then (0: none), and
	// expired is the error of a step placed past that bound.
	scheduled       time.Time
	scheduleToClose time.Duration
	expired         error
	heartbeat       time.Duration // StepOpts.HeartbeatTimeout
}

// planStep places a step in the run. done is true when history answers
// (its stored output or error is returned); a step waiting out its retry
// delay suspends the run.
func planStep[T any](x *execution, kind, key string, opts *StepOpts) (p stepPlan, out T, err error, done bool) {
	pos, h := x.next(kind, key)
	p = stepPlan{kind: kind, key: key, pos: pos, n: 1, maxAttempts: defaultStepAttempts, policy: defaultStepRetry}
	if h != nil {
		switch h.state {
		case stepCompleted:
			if err := json.Unmarshal([]byte(h.output), &out); err != nil {
				x.fatal(fmt.Errorf("workflow: run %s: decode stored output of step %q into %T: %w", x.runID, key, out, err))
			}
			return p, out, nil, true
		case stepFailed:
			return p, out, x.stepError(key, h.attempts, h.errMsg, h.errInfo), true
		case stepRetrying:
			if h.wakeAt != nil && h.wakeAt.After(x.now) {
				x.checkCancel()
				x.suspend(h.wakeAt.Sub(x.now))
			}
		}
		p.n = h.attempts + 1
	}
	x.checkCancel()
	if opts != nil {
		if err := opts.validate(); err != nil {
			// The code is wrong: retrying cannot help, as a duplicate key.
			x.fatal(fmt.Errorf("workflow: run %s: step %q: %w", x.runID, key, err))
		}
		if opts.MaxAttempts > 0 {
			p.maxAttempts = opts.MaxAttempts
		}
		if opts.Retry != nil {
			p.policy = opts.Retry
		}
		p.timeout = opts.Timeout
		p.heartbeat = opts.HeartbeatTimeout
	}
	p.scheduled = x.dbNow()
	if h != nil && h.startedAt != nil {
		p.scheduled = *h.startedAt
	}
	if opts != nil && opts.ScheduleToClose > 0 {
		// All attempts, from the first one's start: this attempt's
		// timeout is what is left, and none starts past it.
		p.scheduleToClose = opts.ScheduleToClose
		switch left := p.scheduled.Add(p.scheduleToClose).Sub(x.dbNow()); {
		case left <= 0:
			p.expired = scheduleToCloseError(p.scheduleToClose, nil)
		case p.timeout == 0 || left < p.timeout:
			p.timeout = left
		}
	}
	return p, out, nil, false
}

// scheduleToCloseError is the error of a step whose attempts ran past
// StepOpts.ScheduleToClose: ErrStepTimeout, and the last attempt's error
// (nil: none ran).
func scheduleToCloseError(d time.Duration, last error) error {
	if last != nil {
		return fmt.Errorf("%w: its attempts passed StepOpts.ScheduleToClose (%s); the last one: %w", ErrStepTimeout, d, last)
	}
	return fmt.Errorf("%w: its attempts passed StepOpts.ScheduleToClose (%s)", ErrStepTimeout, d)
}

// stepError is the *StepError of a step that failed for good, rebuilt from
// what its checkpoint stores: the execution that ran the step returns the
// same one as every replay.
// A stored description that no longer decodes fails the run.
func (x *execution) stepError(key string, attempts int, msg, info string) *StepError {
	err, derr := x.r.rebuildError(msg, info)
	if derr != nil {
		x.fatal(fmt.Errorf("workflow: run %s: step %q: %w", x.runID, key, derr))
	}
	return &StepError{RunID: x.runID, Key: key, Attempts: attempts, Message: msg, Err: err}
}

// settleStep records an attempt's outcome: the output (deferred, see
// later), a retry (the run suspends for the delay) or the step's failure
// for good (a *StepError).
func settleStep[T any](x *execution, p stepPlan, began, ended time.Time, out T, enc []byte, err error, recorded bool) (T, error) {
	var zero T
	if err == nil {
		if !recorded {
			x.later(&stepRow{position: p.pos, key: p.key, kind: p.kind, state: stepCompleted, output: string(enc),
				attempt: newAttempt(p.n, began, ended, nil), startedAt: &p.scheduled})
		}
		x.crashAt(p.key, wfhook.AfterStep)
		return out, nil
	}
	if x.ctx.Err() != nil {
		// The execution itself was stopped (shutdown, lost lease, cancelled
		// job): not the step's failure. Record nothing; the step runs again
		// in the next execution.
		x.stop(&unwind{kind: unwindAbort, err: fmt.Errorf("workflow: run %s: step %q interrupted: %w", x.runID, p.key, context.Cause(x.ctx))})
	}
	msg := boundError(err.Error())
	delay, retryIn := core.RetryInRequested(err)
	if !retryIn {
		delay = p.policy.RetryDelay(p.n, err)
	}
	final := core.IsPermanent(err) || nonRetryable(err) || p.n >= p.maxAttempts
	if !final && p.scheduleToClose > 0 && !x.dbNow().Add(delay).Before(p.scheduled.Add(p.scheduleToClose)) {
		// The next attempt would start past ScheduleToClose: this is the
		// step's last.
		final, err = true, scheduleToCloseError(p.scheduleToClose, err)
		msg = boundError(err.Error())
	}
	x.logStepFailure(p, err, final, delay)
	if final {
		info, dropped := x.r.describeError(err)
		for _, d := range dropped {
			x.r.logger.Warn("relay: workflow step error holds a declared error type that does not round-trip as JSON; errors.As finds none of it",
				"run_id", x.runID, "workflow", x.run.workflow, "step", p.key, "code", d.code, "error", d.why.Error())
		}
		x.record(&stepWrite{row: &stepRow{position: p.pos, key: p.key, kind: p.kind, state: stepFailed, errMsg: msg, errInfo: info,
			attempt: newAttempt(p.n, began, ended, err), startedAt: &p.scheduled}, attempts: 1, delay: -1})
		// The error as stored, not err itself: a replay can rebuild only
		// that, and the workflow must see the same error on both.
		return zero, x.stepError(p.key, p.n, msg, info)
	}
	x.record(&stepWrite{row: &stepRow{position: p.pos, key: p.key, kind: p.kind, state: stepRetrying, errMsg: msg,
		attempt: newAttempt(p.n, began, ended, err), startedAt: &p.scheduled}, attempts: 1, delay: delay})
	x.suspend(delay)
	return zero, nil // not reached
}

// logStepFailure logs a failed attempt of step p at warn: the run, its
// workflow, the step's key and kind, the attempt, its error (bounded as in
// the attempt log), and what comes next (a retry after delay, or the
// step's failure for good, returned to the workflow).
func (x *execution) logStepFailure(p stepPlan, err error, final bool, delay time.Duration) {
	attrs := []any{"run_id", x.runID, "workflow", x.run.workflow, "step", p.key, "step_kind", p.kind,
		"attempt", p.n, "max_attempts", p.maxAttempts, "error", boundText(err.Error(), maxAttemptErrorBytes)}
	if final {
		x.r.logger.Warn("relay: workflow step attempt failed; the step failed for good and its error goes to the workflow", attrs...)
		return
	}
	x.r.logger.Warn("relay: workflow step attempt failed; it will be retried", append(attrs, "retry_in", delay)...)
}

// gate settles, once, how an attempt with a timeout ends: by its own
// result (commit, before the timeout) or by the timeout (expire, before the
// attempt committed to its result). The nil gate (no timeout) always
// commits.
type gate struct {
	mu    sync.Mutex
	state int // 0: running, 1: committed to its result, 2: expired
}

func (g *gate) commit() bool {
	if g == nil {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state == 2 {
		return false
	}
	g.state = 1
	return true
}

func (g *gate) expire() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state == 1 {
		return false
	}
	g.state = 2
	return true
}

// abandoned reports whether the attempt's timeout ended it (expire).
func (g *gate) abandoned() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state == 2
}

// lateResult logs that an attempt of step p abandoned at its timeout has
// returned: its result is discarded (for a StepTx, its transaction rolled
// back). It reads only what an execution never changes, so any goroutine
// may call it.
func (x *execution) lateResult(p stepPlan) {
	x.r.logger.Warn("relay: workflow step attempt returned after its timeout; its result is discarded",
		"run_id", x.runID, "workflow", x.run.workflow, "step", p.key, "step_kind", p.kind, "attempt", p.n, "timeout", p.timeout)
}

// errAttemptAbandoned rolls back the transaction of a StepTx attempt that
// returned after its timeout.
var errAttemptAbandoned = errors.New("workflow: step attempt returned after its timeout")

// timed runs fn, one attempt of a step, bounded by timeout (none when 0:
// fn runs on the caller's goroutine). With a timeout, fn runs on a
// goroutine of its own with a context ending at the timeout, and the
// attempt ends at the timeout even if fn ignores that context: its error
// is then ErrStepTimeout, and whatever fn returns later is discarded. fn
// calls g.commit() before it makes its result durable (a StepTx's
// checkpoint): once it has, its result stands, and timed waits for it.
func timed[R any](x *execution, ctx context.Context, p stepPlan, fn func(ctx context.Context, g *gate) (R, error)) (R, error) {
	timeout := p.timeout
	if timeout <= 0 && p.heartbeat <= 0 {
		// On the run's goroutine: a primitive called by fn is refused
		// (enter), as one from a goroutine of its own is.
		prev := x.inStep
		x.inStep = p.key
		defer func() { x.inStep = prev }()
		return fn(ctx, nil)
	}
	var cancel context.CancelFunc
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	ctx, stopBeats := watchHeartbeats(ctx, p.heartbeat)
	defer stopBeats()
	type result struct {
		r        R
		err      error
		panicked any
	}
	g := &gate{}
	done := make(chan result, 1) // the abandoned goroutine's send never blocks
	go func() {
		var res result
		defer func() {
			res.panicked = recover()
			done <- res
			if g.abandoned() {
				x.lateResult(p)
			}
		}()
		res.r, res.err = fn(ctx, g)
	}()
	settle := func(res result) (R, error) {
		if res.panicked != nil {
			panic(res.panicked) // a primitive's unwind, called inside the step
		}
		return res.r, res.err
	}
	select {
	case res := <-done:
		switch {
		case res.err != nil && x.ctx.Err() == nil && lapsed(ctx):
			res.err = heartbeatError(p.heartbeat, res.err) // failed at the lapse
		case res.err != nil && x.ctx.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
			// Failed at its deadline (most likely of it): a timeout, as
			// for a step that ignores its context.
			res.err = timeoutError(timeout, res.err)
		}
		return settle(res)
	case <-ctx.Done():
	}
	if !g.expire() {
		return settle(<-done) // committed to its result just in time
	}
	var zero R
	if x.ctx.Err() != nil {
		return zero, context.Cause(x.ctx) // the execution stopped: not the step's timeout
	}
	if lapsed(ctx) {
		return zero, heartbeatError(p.heartbeat, nil)
	}
	return zero, timeoutError(timeout, nil)
}

// timeoutError is the error of an attempt that ran past its timeout:
// ErrStepTimeout and context.DeadlineExceeded, and err, what the step
// returned at its deadline (nil: it had not returned).
func timeoutError(timeout time.Duration, err error) error {
	if err != nil {
		return fmt.Errorf("%w after %s (%w): %w", ErrStepTimeout, timeout, context.DeadlineExceeded, err)
	}
	return fmt.Errorf("%w after %s (%w); its result, if it ever returns, is discarded", ErrStepTimeout, timeout, context.DeadlineExceeded)
}

// callStep calls fn, turning a panic into an error.
func callStep[T any](ctx context.Context, fn func(context.Context) (T, error)) (out T, err error) {
	defer func() {
		if p := recover(); p != nil {
			if u, ok := p.(*unwind); ok {
				panic(u) // an unwind raised inside a step (a refused primitive's fatal): not ours to catch
			}
			err = fmt.Errorf("step panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return fn(ctx)
}

// StepAttempt is one attempt of a step's function, as kept in the step's
// attempt log (StepInfo.AttemptLog): its number, its start and end on the
// clock of the worker that ran it, and its error ("" for success),
// bounded to maxAttemptErrorBytes (the step's latest error is kept whole,
// to MaxErrorBytes, in StepInfo.Error). An attempt interrupted by its
// execution's end (a crash, a lost lease, a shutdown) records nothing.
type StepAttempt struct {
	Attempt    int       `json:"attempt"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	Error      string    `json:"error,omitempty"`
}

// maxAttemptLog is how many attempts a step's attempt log keeps (the
// latest); sqlUpsertStep holds the same number.
const maxAttemptLog = 20

// maxAttemptErrorBytes bounds each attempt's error in the log.
const maxAttemptErrorBytes = 1 << 10

// newAttempt is attempt n of a step, from began to ended.
func newAttempt(n int, began, ended time.Time, err error) *StepAttempt {
	a := &StepAttempt{Attempt: n, StartedAt: began.UTC(), FinishedAt: ended.UTC()}
	if err != nil {
		a.Error = boundText(err.Error(), maxAttemptErrorBytes)
	}
	return a
}

// encode is the attempt as JSON for sqlUpsertStep, nil for none.
func (a *StepAttempt) encode() any {
	if a == nil {
		return nil
	}
	b, _ := json.Marshal(a) // a struct of times, ints and a valid string: cannot fail
	return string(b)
}

// userKey fails the run when key, given in code to a primitive of kind,
// uses a prefix the package generates keys with (ReservedKeyPrefixes), or
// is a child key that could clash with the child id of a later generation
// ("<n>/..." with n a number: a child "x" of generation n is
// "<run>/<n>/x"). Fatal, as a duplicate key: the code is wrong, retrying
// cannot help.
func (x *execution) userKey(kind, key string) {
	for _, p := range ReservedKeyPrefixes {
		if strings.HasPrefix(key, p) {
			x.fatal(fmt.Errorf("%w: %s key %q in run %s starts with %q, a prefix the package generates keys with (reserved: %s)",
				ErrReservedKey, kind, key, x.runID, p, strings.Join(ReservedKeyPrefixes, ", ")))
		}
	}
	if kind == "child" {
		if head, _, found := strings.Cut(key, "/"); found && head != "" && strings.Trim(head, "0123456789") == "" {
			x.fatal(fmt.Errorf("%w: child key %q in run %s starts with a number and a slash, as the child ids of a continued run (<run>/<generation>/<key>) do",
				ErrReservedKey, key, x.runID))
		}
	}
}

// permanent marks err as not to be retried.
func permanent(err error) error { return core.Permanent(err) }
