package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
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
		return fmt.Sprintf("workflow.RunNow (eager start: run and job inserted in one round trip, the job claimed by a core client with MaxWorkers %d on queue %q, executed in the caller's goroutine; a queued start when no slot is free), Step per step",
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
}

var relayStepKeys = [ChainSteps]string{"s1", "s2", "s3"}
var relaySleepKeys = [ChainSteps]string{"z0", "z1", "z2"}
var relayChildKeys = [ChainSteps]string{"c1", "c2", "c3"}

func (r RelayWorkflow) Open(ctx context.Context, spec WorkflowSpec) (WorkflowEngine, error) {
	e := &relayWFEngine{spec: spec, eager: r.Eager, start: r.Start}
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
