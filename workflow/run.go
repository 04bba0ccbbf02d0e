package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
	"github.com/relayq/relay/internal/eager"
	"github.com/relayq/relay/internal/jobinsert"
)

// StartOpts tune one Start. The zero value (or nil) means: a random run id,
// queue "default", priority 0, DefaultMaxAttempts.
type StartOpts struct {
	// ID is the run's id, chosen by the caller (an order number, an
	// idempotency key). Starting an id that exists starts nothing and
	// returns that run (Handle.Existing), unless IDConflict or IDReuse
	// say otherwise; for another workflow it is ErrIDInUse. Empty means a
	// random UUID. At most 255 bytes.
	ID string
	// Queue is the queue of the run's executions: the core.Client serving
	// it executes the run. Default "default".
	Queue string
	// Priority orders the run's executions in their queue (0 first).
	Priority int
	// MaxAttempts is how many executions may crash or fail (not those that
	// suspend): the execution after the last of them fails the run instead
	// of running it (its job has a few attempts more for that). Default
	// DefaultMaxAttempts.
	MaxAttempts int
	// ExecutionTimeout bounds the run, from its start, whatever it waits
	// on (a step's retries, a sleep, a signal, a child): once it passes,
	// the run's next execution (it is woken at the deadline) runs its
	// compensations and the run ends failed or compensated, its error
	// starting with ErrRunTimedOut's text. A step running at the deadline
	// is not interrupted (give it StepOpts.Timeout). 0 is none; negative
	// is ErrBadOptions. Retry clears it.
	ExecutionTimeout time.Duration
	// IDConflict is what Start does when a run with ID exists and has not
	// finished. Default IDConflictUseExisting: that run is returned
	// (Handle.Existing).
	IDConflict IDConflictPolicy
	// IDReuse is what Start does when a run with ID exists and has
	// finished. Default IDReuseUseExisting: that run is returned
	// (Handle.Existing), so a start repeated is one run.
	IDReuse IDReusePolicy
	// Tags label the run for people and tools ("order:123",
	// "tenant:acme"): stored with it (Run.Tags), matched by ListOpts.Tags
	// and the admin API's ?tag= filter; the workflow may add more
	// (AddTags). At most MaxTags, each 1 to MaxTagBytes bytes of UTF-8
	// without NUL (else ErrInvalidTag); duplicates are dropped. A start
	// that finds its run existing changes nothing of it, tags included.
	Tags []string
}

// DefaultMaxAttempts is how many executions of a run may crash or fail
// before the run fails.
const DefaultMaxAttempts = 10

// Handle names a started run; its Result waits for the typed output.
type Handle[Out any] struct {
	ID string
	// Existing reports that the run already existed (StartOpts.ID) and
	// nothing was started.
	Existing bool

	reg *Registry
}

// Result waits for the run to finish and returns its output, or a
// *RunError, reading the run through db. It waits on the registry's one
// shared LISTEN connection (no pool connection is held while waiting),
// polling as a fallback; ctx bounds the wait. A registry made without a
// pool has no listener: its handles poll, as Result.
func (h Handle[Out]) Result(ctx context.Context, db core.DB) (Out, error) {
	var w *waiter
	if h.reg != nil && h.reg.pool != nil && h.reg.waiter.open() {
		w = &h.reg.waiter
	}
	return result[Out](ctx, db, h.ID, w)
}

// Start starts a run of wf with input in, through db. Given a transaction
// (pgx, bun or database/sql, as core.Enqueue), the run exists only if and
// when that transaction commits; given a pool, Start commits its own. Input
// that does not encode, or exceeds MaxPayloadBytes, is an error and nothing
// is written.
func Start[In, Out any](ctx context.Context, db core.DB, wf *Workflow[In, Out], in In, opts *StartOpts) (Handle[Out], error) {
	if wf == nil {
		return Handle[Out]{}, errors.New("workflow: start: nil workflow")
	}
	input, err := encode("input of "+wf.name, in)
	if err != nil {
		return Handle[Out]{}, fmt.Errorf("workflow: start %s: %w", wf.name, err)
	}
	id, existing, err := startRun(ctx, db, wf.reg.tracer, eager.Producer{}, wf.name, input, opts, nil)
	return Handle[Out]{ID: id, Existing: existing, reg: wf.reg}, wf.reg.explainMissingSchema(ctx, wf.name, err)
}

// StartNamed starts a run of the workflow registered under name in reg,
// with input already encoded as JSON: for callers that know the workflow by
// name only (a job, an admin call). An unregistered name is ErrUnregistered.
func StartNamed(ctx context.Context, db core.DB, reg *Registry, name string, input json.RawMessage, opts *StartOpts) (id string, existing bool, err error) {
	if reg == nil || !reg.Registered(name) {
		return "", false, fmt.Errorf("%w: %q", ErrUnregistered, name)
	}
	if len(input) == 0 {
		input = json.RawMessage("null")
	}
	if !json.Valid(input) {
		return "", false, fmt.Errorf("workflow: start %s: %w", name, errInvalidInput)
	}
	if len(input) > MaxPayloadBytes {
		return "", false, fmt.Errorf("workflow: start %s: %w: input is %d bytes", name, ErrTooLarge, len(input))
	}
	id, existing, err = startRun(ctx, db, reg.tracer, eager.Producer{}, name, input, opts, nil)
	return id, existing, reg.explainMissingSchema(ctx, name, err)
}

// errInvalidInput: StartNamed's input is not JSON.
var errInvalidInput = errors.New("input is not valid JSON")

// parentLink places a child run under its parent. The child is started in
// a transaction of the parent's execution, which wakes the child's queue
// after its commit (wake, set by startRun), not by a NOTIFY in it:
// PostgreSQL serialises the commits of transactions that NOTIFY.
type parentLink struct {
	runID    string
	position int
	wake     func(ctx context.Context, db any)
	// jobID and trace are the child's job and root trace context, set by
	// startRun when it inserted the child (zero when the child existed).
	jobID int64
	trace string
}

// startRun writes the run and its job in one statement (in the caller's
// transaction, or its own), the job spanned and counted with prod (the
// zero Producer: the global tracer provider and meter, as core.Enqueue).
func startRun(ctx context.Context, db core.DB, tracer trace.Tracer, prod eager.Producer, name string, input []byte, opts *StartOpts, parent *parentLink) (string, bool, error) {
	o, err := startDefaults(name, opts)
	if err != nil {
		return "", false, err
	}
	if o.mayReplace() && parent == nil && !dbx.InTransaction(db) {
		// Replacing a run deletes it and inserts the new one: both commit,
		// or neither.
		var id string
		var existing bool
		err := inTx(ctx, db, func(tx core.DB) error {
			var err error
			id, existing, err = startRun(ctx, tx, tracer, prod, name, input, &o, nil)
			return err
		})
		return id, existing, err
	}
	// The run's root span: every execution, step and child joins its trace.
	ctx, span := tracer.Start(ctx, "workflow "+name, trace.WithAttributes(
		attribute.String("relay.workflow.name", name), attribute.String("relay.workflow.run_id", o.ID)))
	defer span.End()
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	traceJSON, _ := json.Marshal(carrier)
	meta := runJobMetadata(o.ID, carrier)
	var parentID string
	var parentPos *int
	if parent != nil {
		parentID, parentPos = parent.runID, &parent.position
	}
	// The run, its job and the link between them are one statement (one
	// round trip on a pool, where it is its own transaction): the job's id
	// is drawn with the run row, and the job is inserted, by the core's
	// own statement, only if the run was.
	row, err := runJobRow(o, meta)
	if err != nil {
		return "", false, fmt.Errorf("workflow: start %s: %w", name, err)
	}
	job, err := jobinsert.BeginFor(ctx, row, prod.TracerProvider, prod.Enqueued)
	if err != nil {
		return "", false, fmt.Errorf("workflow: start %s: %w", name, err)
	}
	existing, replaced := false, false
	err = func() error {
		ex, err := dbx.For(db)
		if err != nil {
			return err
		}
		var jobID int64
		own := !dbx.InTransaction(db)
		q := sqlStartRun
		if own || parent != nil {
			q = sqlStartRunAfter
		}
		if err := ex.Query(job.Ctx, q, []any{o.ID, name, string(input), o.Queue, parentID, parentPos, string(traceJSON), job.Param(), tagsJSON(o.Tags), deadlineParam(o.ExecutionTimeout)},
			func(r dbx.Scanner) error { return r.Scan(&jobID) }); err != nil {
			job.Done(0, err)
			return err
		}
		if jobID != 0 {
			job.Done(jobID, nil)
			switch {
			case own:
				job.Wake(ctx, db)
			case parent != nil:
				parent.wake, parent.jobID, parent.trace = job.Wake, jobID, string(traceJSON)
			}
			return nil
		}
		job.Done(0, nil) // no job: the run exists
		// The id is taken (by a run committed before this statement
		// ended, or it would have waited for it): by which workflow, and
		// under which parent?
		var holder, holderParent string
		var holderPos *int
		if err := ex.Query(ctx, sqlRunIdentity, []any{o.ID}, func(r dbx.Scanner) error { return r.Scan(&holder, &holderParent, &holderPos) }); err != nil {
			return err
		}
		if holder != name {
			return fmt.Errorf("%w: run %s is a run of %q", ErrIDInUse, o.ID, holder)
		}
		if parent != nil && (holderParent != parent.runID || holderPos == nil || *holderPos != parent.position) {
			// A child is adopted only by the parent that started it, at
			// its position: never a run started on its own, nor one left
			// by a deleted parent of the same id.
			return fmt.Errorf("%w: run %s is not a child of run %s at position %d (a run of %q started otherwise)", ErrIDInUse, o.ID, parent.runID, parent.position, holder)
		}
		if parent == nil && (o.IDConflict != IDConflictUseExisting || o.IDReuse != IDReuseUseExisting) {
			replaced, err = o.settleExisting(ctx, db, ex, name)
			if err != nil || replaced {
				return err
			}
		}
		existing = true
		return nil
	}()
	if err != nil {
		return "", false, fmt.Errorf("workflow: start %s: %w", name, err)
	}
	if replaced {
		// The old run is gone, in this transaction: start the new one (the
		// id is free now; a start racing this one waits for the delete's
		// row lock, then finds the new run), under this start's span: one
		// root span per start.
		again := o
		again.IDConflict, again.IDReuse = IDConflictUseExisting, IDReuseUseExisting
		return startRun(ctx, db, currentSpan{}, prod, name, input, &again, nil)
	}
	return o.ID, existing, nil
}

// runJobRow is the job that executes run o, as its start inserts it (the
// checks core's Enqueue would make of it: o's other fields are checked by
// startRun).
func runJobRow(o StartOpts, meta map[string]any) (jobinsert.Row, error) {
	if reason := jobinsert.NameProblem(o.Queue, 128); reason != "" {
		return jobinsert.Row{}, fmt.Errorf("queue: %s", reason)
	}
	if reason := jobinsert.NameProblem(o.ID, 255); reason != "" {
		return jobinsert.Row{}, fmt.Errorf("run id: %s", reason)
	}
	if o.MaxAttempts > core.MaxAttemptsLimit-failReserve {
		return jobinsert.Row{}, fmt.Errorf("MaxAttempts %d is above %d", o.MaxAttempts, core.MaxAttemptsLimit-failReserve)
	}
	args, err := json.Marshal(runArgs{RunID: o.ID})
	if err != nil {
		return jobinsert.Row{}, err
	}
	metadata, err := json.Marshal(meta)
	if err != nil {
		return jobinsert.Row{}, err
	}
	return jobinsert.Row{
		Kind: RunKind, Queue: o.Queue, Args: args, Priority: o.Priority,
		MaxAttempts: o.MaxAttempts + failReserve, Metadata: metadata,
	}, nil
}

// nonNil is tags, or an empty slice for none (the column is NOT NULL).
func nonNil(tags []string) []string {
	if tags == nil {
		return []string{}
	}
	return tags
}

// tagsJSON is tags as a JSON array, as the statements that any
// database/sql driver runs take them.
func tagsJSON(tags []string) string {
	b, _ := json.Marshal(nonNil(tags))
	return string(b)
}

// inTx runs fn in db's transaction when db is one, else in a transaction
// begun on db (a pool or connection), committed when fn returns nil.
func inTx(ctx context.Context, db core.DB, fn func(tx core.DB) error) error {
	return dbx.InTx(ctx, db, func(tx any) error { return fn(tx) })
}

// Result waits for run id to finish, and returns its output decoded into T,
// or a *RunError when it failed, was compensated or was cancelled. It polls
// db (every few milliseconds at first, backing off to a second) and holds
// no connection between polls; Handle.Result waits on a notification
// instead. ctx bounds the wait.
func Result[T any](ctx context.Context, db core.DB, id string) (T, error) {
	return result[T](ctx, db, id, nil)
}

func result[T any](ctx context.Context, db core.DB, id string, w *waiter) (T, error) {
	var zero T
	ex, err := dbx.For(db)
	if err != nil {
		return zero, fmt.Errorf("workflow: result of %s: %w", id, err)
	}
	delay := 2 * time.Millisecond
	for {
		if w != nil && !w.open() {
			w, delay = nil, 2*time.Millisecond // Registry.Close: poll from here on
		}
		var woken, connected <-chan struct{}
		var mine *sub
		release := func() {}
		if w != nil {
			mine, connected, release = w.subscribe(id)
			woken = mine.ch
			// Read the run only once the listener listens, or a
			// notification could slip between the read and the LISTEN.
			select {
			case <-connected:
			case <-time.After(5 * time.Second):
			case <-ctx.Done():
				release()
				return zero, fmt.Errorf("workflow: result of %s: %w", id, ctx.Err())
			}
		}
		found := false
		var name, state, output, msg string
		err := ex.Query(ctx, sqlRunOutcome, []any{id}, func(r dbx.Scanner) error {
			found = true
			return r.Scan(&name, &state, &output, &msg)
		})
		switch s := RunState(state); {
		case err != nil:
			release()
			return zero, fmt.Errorf("workflow: result of %s: %w", id, err)
		case !found:
			release()
			return zero, fmt.Errorf("workflow: result of %s: %w", id, ErrRunNotFound)
		case s == StateCompleted:
			release()
			var out T
			if err := json.Unmarshal([]byte(output), &out); err != nil {
				return zero, fmt.Errorf("workflow: result of %s: decode output into %T: %w", id, out, err)
			}
			return out, nil
		case s.Final():
			release()
			return zero, &RunError{RunID: id, Workflow: name, State: s, Message: msg}
		}
		if w != nil {
			delay = time.Second // the notification comes first; this is the fallback
		}
		select {
		case <-ctx.Done():
			release()
			return zero, fmt.Errorf("workflow: result of %s: %w", id, ctx.Err())
		case <-woken:
			if f := mine.outcome; f != nil {
				// This process recorded the outcome: no read.
				release()
				if f.state == StateCompleted {
					var out T
					if err := json.Unmarshal(f.output, &out); err != nil {
						return zero, fmt.Errorf("workflow: result of %s: decode output into %T: %w", id, out, err)
					}
					return out, nil
				}
				return zero, &RunError{RunID: id, Workflow: f.workflow, State: f.state, Message: f.msg}
			}
		case <-time.After(delay):
		}
		release()
		delay = min(delay*2, time.Second)
	}
}
