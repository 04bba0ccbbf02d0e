package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/workflow"
)

// RelayWorkflow is the WorkflowSystem for this repository's workflow
// package: a core client with spec.Workers slots on one queue executes the
// runs, in the harness's process; callers Start a run on that queue and
// wait with Result (LISTEN/NOTIFY, polling as a fallback). With Eager,
// callers use workflow.RunNow instead: the run is inserted already claimed
// by that client and executed in the caller's goroutine (an eager start).
//
// Start picks how mode "starts" starts a batch (WorkflowSpec.Batch): "tx",
// one workflow.Start per run in one transaction; "many", one
// workflow.StartMany; "" starts each run in its own transaction.
type RelayWorkflow struct {
	Eager bool
	Start string
}

func (r RelayWorkflow) Name() string {
	switch {
	case r.Eager:
		return "relay_eager"
	case r.Start != "":
		return "relay_" + r.Start
	}
	return "relay"
}

// StartsOnly says the system differs from plain Relay only in how it
// starts batches (mode "starts").
func (r RelayWorkflow) StartsOnly() bool { return r.Start != "" }

// LatencyOnly says the system differs from plain Relay only in how
// callers start and wait (the latency mode): an eager start has no queued
// mode of its own.
func (r RelayWorkflow) LatencyOnly() bool { return r.Eager }

func (r RelayWorkflow) Describe(spec WorkflowSpec) string {
	switch r.Start {
	case "many":
		return fmt.Sprintf("workflow.StartMany of %d runs per call (one statement, its own transaction), %d callers", spec.Batch, max(spec.Starters, 16))
	case "tx":
		return fmt.Sprintf("workflow.Start of each run, %d per transaction, %d callers", spec.Batch, max(spec.Starters, 16))
	}
	if r.Eager {
		return fmt.Sprintf("workflow.RunNow (eager start: run and job inserted in one statement, the job claimed by a core client with MaxWorkers %d on queue %q, executed in the caller's goroutine; a queued start when no slot is free), Step per step",
			spec.Workers, relayWFQueue)
	}
	return fmt.Sprintf("workflow.Start on queue %q + a core client executing it (MaxWorkers %d, defaults otherwise: FetchLimit 1000, LISTEN/NOTIFY); callers wait with workflow.Result; Step per step, Sleep(0) for sleeps, Child+Get for child runs",
		relayWFQueue, spec.Workers)
}

const relayWFQueue = "bench"

type relayWFEngine struct {
	spec     WorkflowSpec
	eager    bool
	start    string // RelayWorkflow.Start
	url      string
	pool     *pgxpool.Pool // the callers' and the harness's
	wpool    *pgxpool.Pool // the workers'
	client   *core.Client
	chain    *workflow.Workflow[Shape, int]
	progress atomic.Int64
	drop     func()
	counter  StatementCounter
	hops     *hopLog // spec.Hops: the calls' hops, else nil
	seq      atomic.Int64
}

// The points of a queued call's hops, in order (WorkflowSpec.Hops): the
// caller's, the workflow function's, and the database's own timestamps of
// the run (the claim statement's now(), the first checkpoint's, which sets
// started_at, and the outcome's), read after the measurement. A database
// timestamp is its transaction's start, so it marks when that statement's
// group began on the server, not when it committed.
var relayHopPoints = []string{"call", "start committed", "claimed", "function entered",
	"step 1", "checkpoint 1 began", "step 2", "step 3", "function returned", "outcome began", "result returned"}

// The eager start's: RunNow returns after the function (no claim, no
// result read).
var relayEagerHopPoints = []string{"call", "function entered",
	"step 1", "checkpoint 1 began", "step 2", "step 3", "function returned", "outcome began", "result returned"}

var relayStepKeys = [ChainSteps]string{"s1", "s2", "s3"}
var relaySleepKeys = [ChainSteps]string{"z0", "z1", "z2"}
var relayChildKeys = [ChainSteps]string{"c1", "c2", "c3"}

func (r RelayWorkflow) Open(ctx context.Context, spec WorkflowSpec) (WorkflowEngine, error) {
	e := &relayWFEngine{spec: spec, eager: r.Eager, start: r.Start}
	if spec.Hops && spec.Mode == "latency" {
		if r.Eager {
			e.hops = newHopLog(relayEagerHopPoints...)
		} else {
			e.hops = newHopLog(relayHopPoints...)
		}
	}
	schema := pgx.Identifier{spec.Schema}.Sanitize()
	conn, err := pgx.Connect(ctx, spec.URL)
	if err != nil {
		return nil, err
	}
	_, err = conn.Exec(ctx, fmt.Sprintf("DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s", schema, schema))
	conn.Close(ctx)
	if err != nil {
		return nil, err
	}
	e.drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, spec.URL); err == nil {
			c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck
			c.Close(ctx)
		}
	}
	u, err := url.Parse(spec.URL)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set("search_path", spec.Schema)
	u.RawQuery = q.Encode()
	e.url = u.String()
	// The callers' pool is the harness's (large enough that callers, or
	// the queued mode's starters, never queue for a connection, and no
	// larger: tests run several benchmarks and proofs against one server);
	// the workers' is sized as a bench worker process's. Both count their
	// statements.
	users := spec.Callers
	if spec.Mode == "queued" {
		users = cmp.Or(spec.Starters, 16)
	}
	if e.pool, err = CountingPool(ctx, e.url, max(8, min(users+4, 48)), &e.counter); err != nil {
		return nil, err
	}
	if _, err := migrations.Migrate(ctx, e.pool); err != nil {
		e.Close()
		return nil, err
	}
	if e.wpool, err = CountingPool(ctx, e.url, max(8, min(spec.Workers+4, 40)), &e.counter); err != nil {
		e.Close()
		return nil, err
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := workflow.NewRegistry(e.wpool, &workflow.Config{Logger: logger})
	noop := func(context.Context) (int, error) { return 0, nil }
	child := workflow.MustRegister(reg, "bench.child", func(wctx workflow.Context, i int) (int, error) {
		return workflow.Step(wctx, "c", noop, nil)
	})
	e.chain = workflow.MustRegister(reg, "bench.chain", func(wctx workflow.Context, shape Shape) (int, error) {
		if e.hops != nil {
			return e.tracedChain(wctx, shape, noop)
		}
		for i := range ChainSteps {
			switch shape {
			case ShapeSleep:
				if i > 0 {
					if err := workflow.Sleep(wctx, relaySleepKeys[i], 0); err != nil {
						return 0, err
					}
				}
			case ShapeChild:
				f := workflow.Child(wctx, relayChildKeys[i], child, i, &workflow.ChildOpts{Queue: relayWFQueue})
				if _, err := f.Get(wctx); err != nil {
					return 0, err
				}
				continue
			}
			if _, err := workflow.Step(wctx, relayStepKeys[i], noop, nil); err != nil {
				return 0, err
			}
		}
		e.progress.Add(1)
		return ChainSteps, nil
	})
	ws := core.NewWorkers()
	if err := reg.AddWorkers(ws); err != nil {
		e.Close()
		return nil, err
	}
	if e.client, err = core.NewClient(e.wpool, &core.Config{
		Workers: ws,
		Queues:  map[string]core.QueueConfig{relayWFQueue: {MaxWorkers: spec.Workers}},
		Logger:  logger,
	}); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// tracedChain is the chain shape marking its hops (WorkflowSpec.Hops).
func (e *relayWFEngine) tracedChain(wctx workflow.Context, shape Shape, noop func(context.Context) (int, error)) (int, error) {
	if shape != ShapeChain {
		return 0, fmt.Errorf("bench: hops are timed for the %s shape only", ShapeChain)
	}
	id := wctx.RunID()
	e.hops.mark(id, "function entered", time.Now())
	for i := range ChainSteps {
		point := fmt.Sprintf("step %d", i+1)
		if _, err := workflow.Step(wctx, relayStepKeys[i], func(ctx context.Context) (int, error) {
			e.hops.mark(id, point, time.Now())
			return noop(ctx)
		}, nil); err != nil {
			return 0, err
		}
	}
	e.progress.Add(1)
	e.hops.mark(id, "function returned", time.Now())
	return ChainSteps, nil
}

// Hops implements HopReporter: the calls' own marks, with the database's
// timestamps of their runs read now, in one query.
func (e *relayWFEngine) Hops(ctx context.Context, from, to time.Time) ([]HopFigure, error) {
	if e.hops == nil {
		return nil, nil
	}
	rows, err := e.pool.Query(ctx, `
SELECT r.id, j.attempted_at, r.started_at, r.finished_at
FROM relay_workflow_runs AS r JOIN relay_jobs AS j ON j.id = r.job_id
WHERE r.workflow = 'bench.chain' AND r.finished_at IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("read the runs' timestamps: %w", err)
	}
	type dbTimes struct{ claimed, started, finished time.Time }
	db := map[string]dbTimes{}
	for rows.Next() {
		var id string
		var t dbTimes
		var claimed, started *time.Time
		if err := rows.Scan(&id, &claimed, &started, &t.finished); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the runs' timestamps: %w", err)
		}
		if claimed != nil {
			t.claimed = *claimed
		}
		if started != nil {
			t.started = *started
		}
		db[id] = t
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the runs' timestamps: %w", err)
	}
	l := e.hops
	l.mu.Lock()
	for _, c := range l.calls {
		t, ok := db[c.runID]
		if !ok {
			continue
		}
		for point, at := range map[string]time.Time{"claimed": t.claimed, "checkpoint 1 began": t.started, "outcome began": t.finished} {
			if i := slices.Index(l.points, point); i >= 0 && !at.IsZero() {
				c.marks[i] = at
			}
		}
	}
	l.mu.Unlock()
	return l.figures(from, to), nil
}

func (e *relayWFEngine) Enqueue(ctx context.Context, shape Shape) error {
	_, err := workflow.Start(ctx, e.pool, e.chain, shape, &workflow.StartOpts{Queue: relayWFQueue})
	return err
}

// StartBatch implements BatchStarter: n runs in one transaction, by
// workflow.Start each ("tx") or by one workflow.StartMany ("many"); the
// plain system starts each in its own transaction.
func (e *relayWFEngine) StartBatch(ctx context.Context, shape Shape, n int) error {
	opts := &workflow.StartOpts{Queue: relayWFQueue}
	switch e.start {
	case "many":
		runs := make([]workflow.StartParams[Shape], n)
		for i := range runs {
			runs[i] = workflow.StartParams[Shape]{Input: shape, Opts: opts}
		}
		_, err := workflow.StartMany(ctx, e.pool, e.chain, runs)
		return err
	case "tx":
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			for range n {
				if _, err := workflow.Start(ctx, tx, e.chain, shape, opts); err != nil {
					return err
				}
			}
			return nil
		})
	}
	for range n {
		if err := e.Enqueue(ctx, shape); err != nil {
			return err
		}
	}
	return nil
}

func (e *relayWFEngine) Serve(ctx context.Context) error {
	return e.client.Start(context.WithoutCancel(ctx))
}

func (e *relayWFEngine) Progress() int64 { return e.progress.Load() }

func (e *relayWFEngine) Finished(ctx context.Context) (n int64, err error) {
	err = e.pool.QueryRow(ctx, `SELECT count(*) FROM relay_workflow_runs WHERE workflow = 'bench.chain' AND state = 'completed'`).Scan(&n)
	return n, err
}

func (e *relayWFEngine) Call(ctx context.Context, shape Shape) error {
	if e.hops != nil {
		return e.tracedCall(ctx, shape)
	}
	if e.eager {
		_, err := workflow.RunNow(ctx, e.client, e.chain, shape, &workflow.StartOpts{Queue: relayWFQueue})
		return err
	}
	h, err := workflow.Start(ctx, e.pool, e.chain, shape, &workflow.StartOpts{Queue: relayWFQueue})
	if err != nil {
		return err
	}
	_, err = h.Result(ctx, e.pool)
	return err
}

// tracedCall is Call marking its hops (WorkflowSpec.Hops).
func (e *relayWFEngine) tracedCall(ctx context.Context, shape Shape) error {
	began := time.Now()
	opts := &workflow.StartOpts{Queue: relayWFQueue}
	if e.eager {
		// RunNow names its run only when it returns: the caller picks
		// the id, so that the function's marks find the call's.
		opts.ID = fmt.Sprintf("bench-%d-%d", began.UnixNano(), e.seq.Add(1))
		e.hops.mark(opts.ID, "call", began)
		_, err := workflow.RunNow(ctx, e.client, e.chain, shape, opts)
		if err != nil {
			return err
		}
		e.hops.mark(opts.ID, "result returned", time.Now())
		e.hops.done(opts.ID)
		return nil
	}
	h, err := workflow.Start(ctx, e.pool, e.chain, shape, opts)
	if err != nil {
		return err
	}
	e.hops.mark(h.ID, "call", began)
	e.hops.mark(h.ID, "start committed", time.Now())
	if _, err = h.Result(ctx, e.pool); err != nil {
		return err
	}
	e.hops.mark(h.ID, "result returned", time.Now())
	e.hops.done(h.ID)
	return nil
}

func (e *relayWFEngine) Pool() *pgxpool.Pool { return e.pool }

func (e *relayWFEngine) Statements() int64 { return e.counter.Count() }

func (e *relayWFEngine) Close() error {
	var err error
	if e.client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = e.client.Stop(ctx)
		cancel()
	}
	if e.wpool != nil {
		e.wpool.Close()
	}
	if e.pool != nil {
		e.pool.Close()
	}
	if e.drop != nil {
		e.drop()
	}
	return err
}
