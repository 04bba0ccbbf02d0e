package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
	"github.com/relayq/relay/internal/jobinsert"
)

// StartParams is one run of a StartMany: its input and options (nil: as
// Start's defaults).
type StartParams[In any] struct {
	Input In
	Opts  *StartOpts
}

// MaxStartMany is the most runs one StartMany starts.
const MaxStartMany = 10000

// StartMany starts a run of wf for each of runs, through db, in one
// statement however many (as core.EnqueueMany is for jobs), and returns
// their handles in the order given. Given a transaction, the runs exist
// only if and when it commits; given a pool, StartMany commits its own,
// all the runs or none. A run whose id exists starts nothing and its
// handle is Existing, as Start's; one held by another workflow, or by a
// child run, fails the whole call with ErrIDInUse (nothing is started).
// Each run is checked as Start checks it, and the first bad one fails the
// call naming its index, before anything is written; so do two runs of
// one id. A run whose options ask for another id policy than the default
// (IDConflict, IDReuse) or an ExecutionTimeout is started alone, as Start
// would, in the same transaction.
func StartMany[In, Out any](ctx context.Context, db core.DB, wf *Workflow[In, Out], runs []StartParams[In]) ([]Handle[Out], error) {
	if wf == nil {
		return nil, errors.New("workflow: start many: nil workflow")
	}
	if len(runs) > MaxStartMany {
		return nil, fmt.Errorf("workflow: start many %s: %d runs, at most %d a call", wf.name, len(runs), MaxStartMany)
	}
	if len(runs) == 0 {
		return nil, nil
	}
	b, err := prepareRuns(ctx, wf, runs)
	if err != nil {
		return nil, err
	}
	handles := make([]Handle[Out], len(runs))
	for i, r := range b.runs {
		handles[i] = Handle[Out]{ID: r.ID, reg: wf.reg}
	}
	own := !dbx.InTransaction(db)
	err = inTx(ctx, db, func(tx core.DB) error {
		existing, err := b.insert(ctx, tx, own)
		if err != nil {
			return err
		}
		for i := range handles {
			handles[i].Existing = existing[i]
		}
		for _, i := range b.alone {
			h, err := Start(ctx, tx, wf, runs[i].Input, &b.opts[i])
			if err != nil {
				return fmt.Errorf("run %d of %d: %w", i+1, len(runs), err)
			}
			handles[i] = h
		}
		return nil
	})
	if err != nil {
		return nil, wf.reg.explainMissingSchema(ctx, wf.name, fmt.Errorf("workflow: start many %s: %w", wf.name, err))
	}
	if own {
		b.wake(ctx, db)
	}
	return handles, nil
}

// batchRun is one run of a StartMany as its statement reads it.
type batchRun struct {
	ID       string          `json:"id"`
	Workflow string          `json:"workflow"`
	Input    json.RawMessage `json:"input"`
	Queue    string          `json:"queue"`
	Trace    json.RawMessage `json:"trace"`
	Tags     []string        `json:"tags"`
}

// runBatch is a StartMany's runs, checked and encoded.
type runBatch struct {
	name  string
	runs  []batchRun
	jobs  []jobinsert.Row
	opts  []StartOpts // with defaults
	alone []int       // the runs Start starts on its own (another id policy)
	// inserted reports, after insert, whether the run at each position
	// was inserted (its job is woken).
	inserted []bool
}

// prepareRuns checks and encodes runs, each under its root span (ended at
// once: the run's trace is its stored context).
func prepareRuns[In, Out any](ctx context.Context, wf *Workflow[In, Out], runs []StartParams[In]) (*runBatch, error) {
	b := &runBatch{name: wf.name, runs: make([]batchRun, len(runs)), opts: make([]StartOpts, len(runs))}
	seen := make(map[string]int, len(runs))
	for i, p := range runs {
		bad := func(err error) error {
			return fmt.Errorf("workflow: start many %s: run %d of %d: %w", wf.name, i+1, len(runs), err)
		}
		o, err := startDefaults(wf.name, p.Opts)
		if err != nil {
			return nil, bad(err)
		}
		if j, dup := seen[o.ID]; dup {
			return nil, bad(fmt.Errorf("run id %q is also run %d's", o.ID, j+1))
		}
		seen[o.ID] = i
		input, err := encode("input of "+wf.name, p.Input)
		if err != nil {
			return nil, bad(err)
		}
		b.opts[i] = o
		b.runs[i] = batchRun{ID: o.ID, Workflow: wf.name, Input: input, Queue: o.Queue, Trace: json.RawMessage("{}"), Tags: o.Tags}
		if o.IDConflict != IDConflictUseExisting || o.IDReuse != IDReuseUseExisting || o.ExecutionTimeout != 0 {
			// Start writes what the batch statement does not: the id
			// policies' decisions, the execution timeout's deadline.
			b.alone = append(b.alone, i)
			continue
		}
		_, span := wf.reg.tracer.Start(ctx, "workflow "+wf.name, trace.WithAttributes(
			attribute.String("relay.workflow.name", wf.name), attribute.String("relay.workflow.run_id", o.ID)))
		carrier := propagation.MapCarrier{}
		traceContext.Inject(trace.ContextWithSpan(ctx, span), carrier)
		span.End()
		b.runs[i].Trace, _ = json.Marshal(carrier)
		row, err := runJobRow(o, runJobMetadata(o.ID, carrier))
		if err != nil {
			return nil, bad(err)
		}
		b.jobs = append(b.jobs, row)
	}
	return b, nil
}

// insert writes the batch's runs (but those started alone) and their jobs
// in one statement in tx, and reports which runs existed. A run id held by
// another workflow or a child run is ErrIDInUse.
func (b *runBatch) insert(ctx context.Context, tx core.DB, own bool) ([]bool, error) {
	existing := make([]bool, len(b.runs))
	b.inserted = make([]bool, len(b.runs))
	batch := b.runs
	if len(b.alone) > 0 {
		batch = make([]batchRun, 0, len(b.runs)-len(b.alone))
		skip := map[int]bool{}
		for _, i := range b.alone {
			skip[i] = true
		}
		for i, r := range b.runs {
			if !skip[i] {
				batch = append(batch, r)
			}
		}
	}
	if len(batch) == 0 {
		return existing, nil
	}
	ex, err := dbx.For(tx)
	if err != nil {
		return nil, err
	}
	runsJSON, err := json.Marshal(batch)
	if err != nil {
		return nil, err
	}
	ctx, span, _ := jobinsert.StartSpan(ctx, nil, batch[0].Queue, len(batch))
	defer span.End()
	q := sqlStartRunsAtCommit
	if own {
		q = sqlStartRunsAfter
	}
	ins := map[string]bool{}
	err = ex.Query(ctx, q, []any{string(runsJSON), string(jobinsert.AppendBatch(nil, b.jobs))}, func(r dbx.Scanner) error {
		var id string
		var jobID int64
		if err := r.Scan(&id, &jobID); err != nil {
			return err
		}
		ins[id] = true
		return nil
	})
	if err != nil {
		span.RecordError(err)
		return nil, err
	}
	var held []string
	pos := map[string]int{}
	for i, r := range b.runs {
		pos[r.ID] = i
	}
	for _, r := range batch {
		if ins[r.ID] {
			b.inserted[pos[r.ID]] = true
		} else {
			held = append(held, r.ID)
		}
	}
	inserted := 0
	jobOf := make([]bool, 0, len(b.jobs))
	for _, r := range batch {
		jobOf = append(jobOf, ins[r.ID])
		if ins[r.ID] {
			inserted++
		}
	}
	jobinsert.Count(ctx, nil, b.jobs, func(i int) bool { return jobOf[i] })
	span.SetAttributes(attribute.Int("relay.workflow.runs_started", inserted))
	if len(held) == 0 {
		return existing, nil
	}
	// The ids taken (by runs committed before the statement ended): by
	// this workflow's root runs (existing), or by someone else's.
	heldJSON, _ := json.Marshal(held)
	err = ex.Query(ctx, sqlRunIdentities, []any{string(heldJSON)}, func(r dbx.Scanner) error {
		var id, workflow string
		var child bool
		if err := r.Scan(&id, &workflow, &child); err != nil {
			return err
		}
		switch {
		case workflow != b.name:
			return fmt.Errorf("%w: run %s is a run of %q", ErrIDInUse, id, workflow)
		case child:
			return fmt.Errorf("%w: run %s is a child run", ErrIDInUse, id)
		}
		existing[pos[id]] = true
		return nil
	})
	return existing, err
}

// wake wakes the queues of the jobs inserted, after the commit.
func (b *runBatch) wake(ctx context.Context, db core.DB) {
	ex, err := dbx.For(db)
	if err != nil {
		return
	}
	var rows []jobinsert.Row
	j := 0
	skip := map[int]bool{}
	for _, i := range b.alone {
		skip[i] = true
	}
	for i := range b.runs {
		if skip[i] {
			continue
		}
		if b.inserted[i] {
			rows = append(rows, b.jobs[j])
		}
		j++
	}
	jobinsert.Wake(ctx, db, ex, jobinsert.QueuesToWake(rows, func(int) bool { return true }), jobinsert.DefaultWakeWindow)
}
