package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/eager"
	"github.com/relayq/relay/internal/jobinsert"
)

// RunNow starts a run of wf and waits for its outcome, executing it in the
// caller's goroutine: an eager start, Relay's twin of Temporal's Eager
// Workflow Start and of DBOS's RunWorkflow. The run's row and its job are
// written in one statement with the job already claimed by c (as if c's
// fetch loop had claimed it: attempt 1, a fresh lease token, c's lease
// duration, one of the queue's MaxWorkers slots), and the execution then
// runs here, through c's worker path (middleware, tracing, metrics, the
// lease fence), with no NOTIFY, claim or wake-up between the start and the
// result.
//
// Everything else is as for Start + Handle.Result: the run is durable from
// the start's commit. If the process dies, the job's lease expires and the
// rescuer hands the run to any worker; if the run suspends (Sleep,
// WaitSignal, a child's Get) or its execution fails and is retried, the job
// goes back to the queue as usual and RunNow waits for the run's result, as
// Handle.Result does. A run id that exists (StartOpts.ID) starts nothing:
// RunNow returns that run's result (ErrIDInUse if it is another workflow's).
//
// c must serve opts.Queue with the workers of wf's registry (AddWorkers):
// otherwise RunNow fails with ErrNotWorked and starts nothing. RunNow falls
// back to an ordinary start (Start, then the result) when c cannot take the
// run now: every worker slot of the queue busy, or c not running (stopping,
// say). A paused queue or a global limit on the queue or on RunKind is
// never bypassed: the run is then started queued, and RunNow waits for it.
//
// ctx bounds the wait. If it ends while the run executes here, the
// execution is cancelled and its job returned to the queue (the attempt
// not counted) for any worker to continue; the run goes on without the
// caller. The start itself is one statement that ctx does not cancel once
// sent (a cancel could hide its commit): if ctx ends meanwhile, RunNow
// returns when the statement answers, its job handed to the queue in the
// same way. The statement waits at most 100 ms for a row lock: a start of
// the same id in a transaction not yet committed is then waited for as
// Start waits for it, under ctx, holding no worker slot meanwhile. A wait
// for a table lock (a migration's, say) is taken before that bound is set,
// and is bounded only by the statement's 15 s.
func RunNow[In, Out any](ctx context.Context, c *core.Client, wf *Workflow[In, Out], in In, opts *StartOpts) (Out, error) {
	var zero Out
	if wf == nil || c == nil {
		return zero, errors.New("workflow: run: nil workflow or client")
	}
	reg := wf.reg
	if reg.pool == nil {
		return zero, fmt.Errorf("workflow: run %s: the registry has no pool (NewRegistry(nil, ...))", wf.name)
	}
	input, err := encode("input of "+wf.name, in)
	if err != nil {
		return zero, fmt.Errorf("workflow: run %s: %w", wf.name, err)
	}
	o, err := startDefaults(wf.name, opts)
	if err != nil {
		return zero, err
	}
	ins, worked := reg.eagerFor(c)
	var prod eager.Producer // c's, for a start that does not go through Lend
	if worked {
		prod = ins.Producer()
	}
	if o.IDConflict != IDConflictUseExisting || o.IDReuse != IDReuseUseExisting || o.ExecutionTimeout != 0 {
		// The id policies decide on the run that holds the id, and a
		// deadline is written with the run, which the eager insert does
		// not do: start it as Start does, and wait.
		return startQueued[Out](ctx, reg, wf.name, input, o, prod)
	}
	sink := &eagerSink{runID: o.ID}
	cl, err := insertEager(context.WithValue(ctx, eagerKey{}, sink), c, reg, wf.name, input, o)
	var held *idHeld
	switch {
	case errors.As(err, &held):
		// The eager statement's root span stands for this start: the
		// queued start joins it (currentSpan), so the caller's trace has
		// one root span, which ends here, once the start is written.
		reg.logger.Debug("relay: eager start found the run's id held; starting the run queued", "run_id", o.ID, "workflow", wf.name, "reason", err)
		err := func() error {
			defer held.span.End()
			_, _, err := startRun(trace.ContextWithSpan(ctx, held.span), reg.pool, currentSpan{}, prod, wf.name, input, &o, nil)
			if err != nil {
				held.span.RecordError(err)
				held.span.SetStatus(codes.Error, err.Error())
			}
			return err
		}()
		if err = reg.explainMissingSchema(ctx, wf.name, err); err != nil {
			return zero, err
		}
		return result[Out](ctx, reg.pool, o.ID, &reg.waiter)
	case errors.Is(err, eager.ErrUnavailable):
		reg.logger.Debug("relay: eager start unavailable; starting the run queued", "run_id", o.ID, "workflow", wf.name, "reason", err)
		return startQueued[Out](ctx, reg, wf.name, input, o, prod)
	case errors.Is(err, errRunExists):
		var holder, parentID string // a run with a parent is no eager caller's
		var parentPos *int
		if err := reg.pool.QueryRow(ctx, sqlRunIdentity, o.ID).Scan(&holder, &parentID, &parentPos); err != nil {
			return zero, fmt.Errorf("workflow: run %s: read existing run %s: %w", wf.name, o.ID, err)
		}
		if holder != wf.name {
			return zero, fmt.Errorf("workflow: run %s: %w: run %s is a run of %q", wf.name, ErrIDInUse, o.ID, holder)
		}
	case err != nil:
		return zero, fmt.Errorf("workflow: run %s: %w", wf.name, err)
	case cl.Row != nil:
		cl.Execute(ctx) //nolint:errcheck // the outcome is the run's, read below
		if sink.done {
			return eagerOutcome[Out](sink, wf.name)
		}
	}
	// Suspended, retried, handed back, left queued (a paused or limited
	// queue), or another caller's run: wait for it.
	return result[Out](ctx, reg.pool, o.ID, &reg.waiter)
}

// startQueued starts run o as Start does, its job counted and spanned as
// an enqueue of the client whose telemetry prod is (the claimed path's
// jobinsert.BeginFor), and waits for its result: RunNow's start when the
// client cannot take the run now.
func startQueued[Out any](ctx context.Context, reg *Registry, name string, input []byte, o StartOpts, prod eager.Producer) (Out, error) {
	_, _, err := startRun(ctx, reg.pool, reg.tracer, prod, name, input, &o, nil)
	if err = reg.explainMissingSchema(ctx, name, err); err != nil {
		var zero Out
		return zero, err
	}
	return result[Out](ctx, reg.pool, o.ID, &reg.waiter)
}

// eagerKey is the context key of an eager caller's eagerSink.
type eagerKey struct{}

// eagerSink receives the outcome of the eager caller's run when the
// caller's own execution records it (execution.finish), so that RunNow
// returns it without reading it back.
type eagerSink struct {
	runID string
	// run is the run as the caller inserted it: its first execution (the
	// caller's) starts from it instead of reading it back (loadOrEager).
	run    *runInfo
	loaded bool
	// lendJob and lendToken are the job and lease token of the parent's
	// execution in whose slot a child runs (executeChild), 0 and "" for
	// an eager start.
	lendJob   int64
	lendToken string
	// resumed: the child's end also wrote the parent's checkpoint of it
	// (sqlFinishChildRun), which the parent's execution then does not.
	resumed bool
	done    bool
	state   RunState
	output  []byte
	msg     string
}

// eagerFinished hands a run's recorded outcome to the eager caller
// executing it, if any; resumed says that the outcome's statement wrote the
// checkpoint of the parent's execution waiting for it (a child in its
// parent's slot).
func eagerFinished(ctx context.Context, runID string, state RunState, output []byte, msg string, resumed bool) {
	if s, ok := ctx.Value(eagerKey{}).(*eagerSink); ok && s.runID == runID {
		s.done, s.state, s.output, s.msg, s.resumed = true, state, output, msg, resumed
	}
}

// loadOrEager loads the run and its history (load), except in the eager
// caller's own first execution of its run: the run is then as the caller
// inserted it in the claim's transaction, with an empty history, and the
// claim's time (the database's now() of that transaction) stands for the
// execution's clock. It saves a round trip per eager run. A child's first
// execution in its parent's slot reads its run but not its history.
func (x *execution) loadOrEager(ctx context.Context) error {
	s, ok := ctx.Value(eagerKey{}).(*eagerSink)
	if !ok || s.runID != x.runID || s.run == nil || s.loaded || x.job.Attempt != 1 {
		return x.load(ctx, true)
	}
	if s.lendJob != 0 {
		// A child executed in its parent's slot (executeChild) reads its
		// run as a queued one does: it was committed, and could be asked
		// to cancel (its parent's Cancel) or sent an update, before this
		// claim; an eager start inserts and claims in one statement. Not
		// its history, which is empty: the parent's execution inserted the
		// run, and this claim took its job before any attempt
		// (sqlClaimKnown), while only an execution holding that job's
		// lease writes a step of it.
		s.loaded = true
		return x.load(ctx, false)
	}
	s.loaded = true
	x.run = *s.run
	x.run.jobID = x.job.ID
	x.now = x.job.AttemptedAt
	x.hist = map[int]*stepRow{}
	return nil
}

// eagerOutcome is the run's outcome as Result returns it.
func eagerOutcome[Out any](s *eagerSink, name string) (Out, error) {
	var out Out
	if s.state != StateCompleted {
		return out, &RunError{RunID: s.runID, Workflow: name, State: s.state, Message: s.msg}
	}
	if err := json.Unmarshal(s.output, &out); err != nil {
		return out, fmt.Errorf("workflow: result of %s: decode output into %T: %w", s.runID, out, err)
	}
	return out, nil
}

// startDefaults fills in opts' defaults and checks them: every start
// (startRun, RunNow) begins with it, so each option is checked once.
func startDefaults(name string, opts *StartOpts) (StartOpts, error) {
	var o StartOpts
	if opts != nil {
		o = *opts
	}
	if o.ID == "" {
		o.ID = uuid.NewString()
	}
	if len(o.ID) > 255 {
		return o, fmt.Errorf("workflow: start %s: run id longer than 255 bytes", name)
	}
	if o.Queue == "" {
		o.Queue = core.DefaultQueue
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.MaxAttempts < 0 || o.Priority < 0 || o.Priority > core.MaxPriority {
		return o, fmt.Errorf("workflow: start %s: MaxAttempts %d or Priority %d out of range", name, o.MaxAttempts, o.Priority)
	}
	if err := o.checkIDPolicies(); err != nil {
		return o, fmt.Errorf("workflow: start %s: %w", name, err)
	}
	tags, err := checkTags(o.Tags)
	if err != nil {
		return o, fmt.Errorf("workflow: start %s: %w", name, err)
	}
	o.Tags = nonNil(tags)
	if o.ExecutionTimeout < 0 {
		return o, fmt.Errorf("workflow: start %s: %w: StartOpts.ExecutionTimeout is %s (0 is none)", name, ErrBadOptions, o.ExecutionTimeout)
	}
	return o, nil
}

// insertEager writes the run and its job in one statement, the job
// inserted already claimed by c for a worker slot of its queue
// (eager.Inserter.Lend with no lending job, sqlEagerStartClaimed): one row
// version of the job where an insert and a claim write two. It runs under
// the run's root span (as startRun). The job's Row is nil when it was
// inserted queued (a paused queue, a global limit: its workers are woken);
// ErrUnavailable when c cannot take the run now, nothing written.
func insertEager(ctx context.Context, c *core.Client, reg *Registry, name string, input []byte, o StartOpts) (eager.Job[*core.JobRow], error) {
	ins, ok := reg.eagerFor(c)
	if !ok {
		return eager.Job[*core.JobRow]{}, fmt.Errorf("the client was not made with the workers of the workflow's registry (AddWorkers): %w", ErrNotWorked)
	}
	lent, err := ins.Lend(ctx, RunKind, o.Queue, nil)
	if err != nil {
		return eager.Job[*core.JobRow]{}, err
	}
	ctx, span := reg.tracer.Start(ctx, "workflow "+name, trace.WithAttributes(
		attribute.String("relay.workflow.name", name), attribute.String("relay.workflow.run_id", o.ID),
		attribute.Bool("relay.workflow.eager", true)))
	keepSpan := false // handed to the queued start that follows (idHeld)
	defer func() {
		if !keepSpan {
			span.End()
		}
	}()
	fail := func(err error) (eager.Job[*core.JobRow], error) {
		lent.Release()
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return eager.Job[*core.JobRow]{}, err
	}
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	traceJSON, _ := json.Marshal(carrier)
	if s, ok := ctx.Value(eagerKey{}).(*eagerSink); ok {
		s.run = &runInfo{workflow: name, state: string(StatePending), input: string(input), queue: o.Queue, trace: string(traceJSON)}
	}
	row, err := runJobRow(o, runJobMetadata(o.ID, carrier))
	if err != nil {
		return fail(err)
	}
	job, err := jobinsert.BeginFor(ctx, row, lent.TracerProvider, lent.Enqueued)
	if err != nil {
		return fail(err)
	}
	// The connection is waited for under ctx: nothing is sent before it.
	conn, err := reg.pool.Acquire(ctx)
	if err != nil {
		job.Done(0, err)
		return fail(err)
	}
	defer conn.Release()
	// The statement commits a job claimed by c: cancelled between its
	// commit and its reply, it would leave a claimed job with no handler
	// until its lease expired. So it is sent under a context of its own,
	// bounded by eagerStatementBound, not the caller's: the caller's
	// context can end only the waits before and after it. Its lock waits
	// are bounded by its own lock_timeout, so a start of the same id not
	// yet committed costs the caller at most that long here, and then a
	// queued start, which waits under ctx and holds no slot.
	bctx, bcancel := context.WithTimeout(context.WithoutCancel(ctx), eagerStatementBound)
	defer bcancel()
	var a eagerAnswer
	a.err = conn.QueryRow(bctx, sqlEagerStartClaimed, o.ID, name, string(input), o.Queue, string(traceJSON),
		nonNil(o.Tags), job.Param(), lent.By, lent.Token.String(), lent.LeaseMS).Scan(&a.id, &a.at)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(a.err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "relay_workflow_runs_pkey":
		// The run exists: nothing of this call's was written, and nothing
		// failed: RunNow returns that run's result, as startRun does.
		job.Done(0, nil)
		lent.Release()
		return eager.Job[*core.JobRow]{}, errRunExists
	case errors.As(a.err, &pgErr) && pgErr.Code == "55P03":
		// The run's id is locked by a start not yet committed: the caller
		// waits for it with a queued start, which waits under ctx and
		// holds no worker slot meanwhile, under this span.
		job.Done(0, nil)
		lent.Release()
		span.SetAttributes(attribute.Bool("relay.workflow.eager", false))
		span.AddEvent("run id held by a start not yet committed: starting the run queued")
		keepSpan = true
		return eager.Job[*core.JobRow]{}, &idHeld{span: span, err: a.err}
	case a.err != nil:
		// No answer (the bound, a broken connection) may hide a commit:
		// the run, if written, is found by its id.
		job.Done(a.id, a.err)
		return fail(fmt.Errorf("start unanswered, the run may have been written: %w", a.err))
	}
	job.Done(a.id, nil)
	if a.at == nil {
		// Inserted queued, as a claim would have left it: its workers
		// take it, and the caller waits for its result.
		lent.Release()
		job.Wake(ctx, reg.pool)
		return eager.Job[*core.JobRow]{ID: a.id}, nil
	}
	return lent.Adopt(ctx, a.id, job.Row(), *a.at), nil
}

// idHeld is insertEager's answer when the run's id was locked by a start
// not yet committed (55P03): nothing was written, and span, the run's root
// span, is still open for the queued start that follows; RunNow ends it.
type idHeld struct {
	span trace.Span
	err  error
}

func (e *idHeld) Error() string {
	return "run id held by a start not yet committed: " + e.err.Error()
}

func (e *idHeld) Unwrap() error { return e.err }

// currentSpan is a tracer whose spans are the context's own: a start made
// under a span that already stands for the run (RunNow's queued start after
// its eager statement found the id held) adds no second root span. The
// context must carry that span (without one, the start's trace context is
// empty); the span's owner ends it, not the start (unended).
type currentSpan struct{ embedded.Tracer }

func (currentSpan) Start(ctx context.Context, _ string, _ ...trace.SpanStartOption) (context.Context, trace.Span) {
	return ctx, unended{trace.SpanFromContext(ctx)}
}

// unended is a span whose End is its owner's to call (currentSpan).
type unended struct{ trace.Span }

func (unended) End(...trace.SpanEndOption) {}

// eagerStatementBound bounds the round trip of an eager start's statement,
// which its caller's context does not cancel (insertEager). Its lock
// waits are bounded far below it (sqlEagerStartClaimed's lock_timeout).
const eagerStatementBound = 15 * time.Second

// eagerAnswer is the answer to an eager start's statement: the job's id
// and attempted_at (nil: inserted queued), or the statement's error.
type eagerAnswer struct {
	id  int64
	at  *time.Time
	err error
}

// errRunExists: an eager start found its run id in use, and wrote nothing.
var errRunExists = errors.New("workflow: the run exists")
