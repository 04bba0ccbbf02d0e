package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/bench"
)

// DBOS is the bench.WorkflowSystem for DBOS Transact Go v1.8.0
// (github.com/dbos-inc/dbos-transact-golang), configured as its README
// shows: a system database on the same PostgreSQL (its own schema), its
// default pool (20 connections), workflows registered by name, steps run
// with RunAsStep. Queued runs are enqueued by a dbos.Client and executed
// by a launched context's queue runner (WorkerConcurrency = spec.Workers,
// polling every spec.Poll); callers run workflows directly (RunWorkflow
// without a queue: the workflow runs in the caller's process, with no
// queue in between) and wait with GetResult.
type DBOS struct{}

func (DBOS) Name() string { return "dbos" }

func (DBOS) Describe(spec bench.WorkflowSpec) string {
	if spec.Mode == "latency" {
		return "v1.8.0, pgx pool of 20 (its default size, made by the harness to count statements); RunWorkflow without a queue (runs in the caller's process) + GetResult; RunAsStep per step, Sleep(0) for sleeps, RunWorkflow+GetResult for child runs"
	}
	return fmt.Sprintf("v1.8.0, pgx pool of 20 (its default size, made by the harness to count statements); dbos.Client.Enqueue to a queue with WorkerConcurrency %d, base polling interval %s; one launched context drains it",
		spec.Workers, spec.Poll)
}

const dbosQueue = "bench"

type dbosEngine struct {
	spec     bench.WorkflowSpec
	pool     *pgxpool.Pool
	dctx     dbos.Context
	client   dbos.Client
	progress atomic.Int64
	served   bool
	queue    dbos.Queue
	counter  bench.StatementCounter
	sysPool  *pgxpool.Pool // DBOS's own, counting its statements
}

func (DBOS) Open(ctx context.Context, spec bench.WorkflowSpec) (bench.WorkflowEngine, error) {
	e := &dbosEngine{spec: spec}
	conn, err := pgx.Connect(ctx, spec.URL)
	if err != nil {
		return nil, err
	}
	_, err = conn.Exec(ctx, fmt.Sprintf("DROP SCHEMA IF EXISTS %s CASCADE", pgx.Identifier{spec.Schema}.Sanitize()))
	conn.Close(ctx)
	if err != nil {
		return nil, err
	}
	if e.pool, err = bench.NewPool(ctx, spec.URL); err != nil {
		return nil, err
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	// DBOS's system pool, as it makes its own (20 connections), but
	// counting statements.
	if e.sysPool, err = bench.CountingPool(ctx, spec.URL, 20, &e.counter); err != nil {
		e.pool.Close()
		return nil, err
	}
	e.dctx, err = dbos.NewContext(context.WithoutCancel(ctx), dbos.Config{
		AppName:        "relay-bench",
		SystemDBPool:   e.sysPool,
		DatabaseSchema: spec.Schema,
		Logger:         logger,
	})
	if err != nil {
		e.pool.Close()
		e.sysPool.Close()
		return nil, err
	}
	dbos.RegisterWorkflow(e.dctx, e.child, dbos.WithWorkflowName("bench_child"))
	dbos.RegisterWorkflow(e.dctx, e.chain, dbos.WithWorkflowName("bench_chain"))
	if spec.Mode == "queued" || spec.Mode == "starts" {
		opts := []dbos.QueueOption{dbos.WithWorkerConcurrency(spec.Workers)}
		if spec.Poll > 0 {
			opts = append(opts, dbos.WithQueueBasePollingInterval(spec.Poll))
		}
		if e.queue, err = dbos.RegisterQueue(e.dctx, dbosQueue, opts...); err != nil {
			e.Close()
			return nil, err
		}
		if e.client, err = dbos.NewClient(context.WithoutCancel(ctx), dbos.ClientConfig{
			DatabaseURL: spec.URL, DatabaseSchema: spec.Schema, Logger: logger,
		}); err != nil {
			e.Close()
			return nil, err
		}
	}
	return e, nil
}

func dbosNoop(context.Context) (int, error) { return 0, nil }

var dbosStepNames = [bench.ChainSteps]string{"s1", "s2", "s3"}

// chain is the workflow of every shape: the shape is its input.
func (e *dbosEngine) chain(ctx dbos.Context, shape string) (int, error) {
	for i := range bench.ChainSteps {
		switch bench.Shape(shape) {
		case bench.ShapeSleep:
			if i > 0 {
				if _, err := dbos.Sleep(ctx, 0); err != nil {
					return 0, err
				}
			}
		case bench.ShapeChild:
			h, err := dbos.RunWorkflow(ctx, e.child, i)
			if err != nil {
				return 0, err
			}
			if _, err := h.GetResult(); err != nil {
				return 0, err
			}
			continue
		}
		if _, err := dbos.RunAsStep(ctx, dbosNoop, dbos.WithStepName(dbosStepNames[i])); err != nil {
			return 0, err
		}
	}
	e.progress.Add(1)
	return bench.ChainSteps, nil
}

// child is a child run of one no-op step.
func (e *dbosEngine) child(ctx dbos.Context, i int) (int, error) {
	return dbos.RunAsStep(ctx, dbosNoop, dbos.WithStepName("c"))
}

func (e *dbosEngine) Enqueue(ctx context.Context, shape bench.Shape) error {
	_, err := dbos.Enqueue[int](e.client, dbosQueue, "bench_chain", string(shape))
	return err
}

func (e *dbosEngine) Serve(context.Context) error {
	if err := dbos.Launch(e.dctx); err != nil {
		return err
	}
	e.served = true
	return nil
}

func (e *dbosEngine) Progress() int64 { return e.progress.Load() }

func (e *dbosEngine) Finished(ctx context.Context) (n int64, err error) {
	err = e.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.workflow_status WHERE name = 'bench_chain' AND status = 'SUCCESS'`,
		pgx.Identifier{e.spec.Schema}.Sanitize())).Scan(&n)
	return n, err
}

func (e *dbosEngine) Call(ctx context.Context, shape bench.Shape) error {
	h, err := dbos.RunWorkflow(e.dctx, e.chain, string(shape))
	if err != nil {
		return err
	}
	_, err = h.GetResult()
	return err
}

func (e *dbosEngine) Pool() *pgxpool.Pool { return e.pool }

func (e *dbosEngine) Statements() int64 {
	if e.spec.Mode == "starts" {
		return -1 // its client's enqueues go through a pool of the client's own, not counted
	}
	return e.counter.Count()
}

func (e *dbosEngine) Close() error {
	if e.client != nil {
		dbos.Shutdown(e.client, 10*time.Second) //nolint:errcheck
	}
	var err error
	if e.dctx != nil {
		err = dbos.Shutdown(e.dctx, 10*time.Second)
	}
	if e.pool != nil {
		e.pool.Close()
	}
	if e.sysPool != nil {
		e.sysPool.Close()
	}
	return err
}
