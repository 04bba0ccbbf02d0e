package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/idempotency"
	"github.com/relayq/relay/workflow"
)

// The workflows of `relay prove workflow`.

// payIn is a payment run's input.
type payIn struct {
	Seq     int  `json:"seq"`
	Fail    bool `json:"fail"` // report fails for good: the payment is refunded
	SleepMs int  `json:"sleep_ms"`
}

// sideIn is a child's input: the payment run it works for.
type sideIn struct {
	Run  string `json:"run"`
	Fail bool   `json:"fail"`
}

const (
	proveSideQueue  = "prove-side"
	proveSignalName = "approval"
)

type proveWorkflows struct {
	payment *workflow.Workflow[payIn, string]
	email   *workflow.Workflow[sideIn, string]
	report  *workflow.Workflow[sideIn, string]
}

// proveEnv is what the workflows reach outside: the proof tables, the sink,
// the worker's id. Nil in the prover, which only starts runs.
type proveEnv struct {
	pool     *pgxpool.Pool
	worker   string
	sink     string
	http     *http.Client
	stepTime time.Duration
}

// registerProveWorkflows registers payment, email and report with reg.
func registerProveWorkflows(reg *workflow.Registry, env *proveEnv) proveWorkflows {
	var w proveWorkflows
	w.email = workflow.MustRegister(reg, "prove.email", func(wctx workflow.Context, in sideIn) (string, error) {
		return env.side(wctx, in, "email")
	})
	w.report = workflow.MustRegister(reg, "prove.report", func(wctx workflow.Context, in sideIn) (string, error) {
		return env.side(wctx, in, "report")
	})
	w.payment = workflow.MustRegister(reg, "prove.payment", func(wctx workflow.Context, in payIn) (string, error) {
		return env.payment(wctx, in, w)
	})
	return w
}

// execution records that an execution of the run began (on its own
// connection, committed whatever happens next) and returns its id.
func (e *proveEnv) execution(ctx context.Context, run string) (int64, error) {
	var id int64
	err := e.pool.QueryRow(ctx, `INSERT INTO prove_wf_execs (run_id, worker) VALUES ($1, $2) RETURNING id`, run, e.worker).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("record execution: %w", err)
	}
	return id, nil
}

// effect writes one effect in the step's transaction, after the step's
// work, and notes on its own connection that the body reached its end (the
// transaction may yet be refused by the fence, or killed).
func (e *proveEnv) effect(ctx context.Context, tx pgx.Tx, run, kind, stepRun string, exec int64) error {
	if e.stepTime > 0 {
		select {
		case <-time.After(e.stepTime):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO prove_wf_effects (run_id, kind, exec_id, step_run) VALUES ($1, $2, $3, $4)`, run, kind, exec, stepRun); err != nil {
		return err
	}
	_, err := e.pool.Exec(ctx, `INSERT INTO prove_wf_tried (run_id, kind, exec_id, worker) VALUES ($1, $2, $3, $4)`, run, kind, exec, e.worker)
	return err
}

// payment: charge → email ∥ report (children on the side queue) → sleep →
// wait for the approval → notify. The charge registers its refund.
func (e *proveEnv) payment(wctx workflow.Context, in payIn, w proveWorkflows) (string, error) {
	run := wctx.RunID()
	exec, err := e.execution(wctx, run)
	if err != nil {
		return "", err
	}
	if _, err := workflow.StepTx(wctx, "charge", func(ctx context.Context, tx pgx.Tx) (int, error) {
		return 100 + in.Seq, e.effect(ctx, tx, run, "payment", run, exec)
	}, nil); err != nil {
		return "", err
	}
	workflow.Compensate(wctx, "refund", func(ctx context.Context) error {
		// A compensation is an at-least-once step: the refund is written
		// once through idempotency.Once, in the refund's own transaction.
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, _, err := idempotency.Once(ctx, tx, "prove.refund", run, func(ctx context.Context) (bool, error) {
				return true, e.effect(ctx, tx, run, "refund", run, exec)
			}, nil)
			return err
		})
	})
	email := workflow.Child(wctx, "email", w.email, sideIn{Run: run}, &workflow.ChildOpts{Queue: proveSideQueue})
	report := workflow.Child(wctx, "report", w.report, sideIn{Run: run, Fail: in.Fail}, &workflow.ChildOpts{Queue: proveSideQueue})
	if _, err := email.Get(wctx); err != nil {
		return "", err
	}
	if _, err := report.Get(wctx); err != nil {
		return "", err
	}
	if err := workflow.Sleep(wctx, "cool-off", time.Duration(in.SleepMs)*time.Millisecond); err != nil {
		return "", err
	}
	if _, err := workflow.Step(wctx, "ask", func(ctx context.Context) (bool, error) {
		_, err := e.pool.Exec(ctx, `INSERT INTO prove_wf_asks (run_id) VALUES ($1)`, run)
		return true, err
	}, nil); err != nil {
		return "", err
	}
	approval, ok, err := workflow.WaitSignal[string](wctx, proveSignalName, 5*time.Minute)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", core.Permanent(errors.New("payment: no approval within 5 minutes"))
	}
	if _, err := workflow.StepTx(wctx, "notify", func(ctx context.Context, tx pgx.Tx) (bool, error) {
		return true, e.effect(ctx, tx, run, "notify", run, exec)
	}, nil); err != nil {
		return "", err
	}
	return approval, nil
}

// side is a child (email or report): its effect in a StepTx, then a send
// to the sink with a token drawn once for the run (replayed after that).
func (e *proveEnv) side(wctx workflow.Context, in sideIn, kind string) (string, error) {
	exec, err := e.execution(wctx, wctx.RunID())
	if err != nil {
		return "", err
	}
	if in.Fail {
		return "", core.Permanent(errors.New("report: the reporting service refused the payment"))
	}
	if _, err := workflow.StepTx(wctx, kind, func(ctx context.Context, tx pgx.Tx) (bool, error) {
		return true, e.effect(ctx, tx, in.Run, kind, wctx.RunID(), exec)
	}, nil); err != nil {
		return "", err
	}
	token := workflow.UUID(wctx, "token").String()
	return workflow.Step(wctx, "send", func(ctx context.Context) (string, error) {
		req, err := http.NewRequestWithContext(ctx, "POST", e.sink+"?run="+url.QueryEscape(in.Run)+"&kind="+kind, nil)
		if err != nil {
			return "", err
		}
		req.Header.Set("Idempotency-Key", token)
		resp, err := e.http.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("sink: %s", resp.Status)
		}
		return token, nil
	}, nil)
}

// runProveWorkflowWorker is one worker process of `relay prove workflow`:
// a core client serving the payment queue and the side queue, executing the
// proof's workflows, until SIGTERM.
func runProveWorkflowWorker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prove-workflow-worker", flag.ContinueOnError)
	dbURL := fs.String("database-url", "", "PostgreSQL URL")
	id := fs.String("id", "", "worker id")
	sinkURL := fs.String("sink", "", "sink URL")
	concurrency := fs.Int("concurrency", 8, "executions at once per queue")
	lease := fs.Duration("lease", 2*time.Second, "lease")
	stepTime := fs.Duration("step-time", 20*time.Millisecond, "how long each StepTx body takes (a payment gateway)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(*dbURL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "relay-prove-worker"
	cfg.MaxConns = int32(*concurrency*4 + 4)
	pool, err := pgxpool.NewWithConfig(context.WithoutCancel(ctx), cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	reg := workflow.NewRegistry(pool, &workflow.Config{Logger: logger, ExecutionRetry: core.Backoff{Base: 50 * time.Millisecond, Max: time.Second}})
	env := &proveEnv{pool: pool, worker: *id, sink: *sinkURL, http: &http.Client{Timeout: 10 * time.Second}, stepTime: *stepTime}
	registerProveWorkflows(reg, env)
	ws := core.NewWorkers()
	if err := reg.AddWorkers(ws); err != nil {
		return err
	}
	client, err := core.NewClient(pool, &core.Config{
		Workers: ws,
		ID:      *id,
		Queues: map[string]core.QueueConfig{
			proveQueue:     {MaxWorkers: *concurrency},
			proveSideQueue: {MaxWorkers: *concurrency},
		},
		LeaseDuration:  *lease,
		RescueInterval: *lease / 4,
		PollInterval:   200 * time.Millisecond,
		RetryPolicy:    core.Backoff{Base: 50 * time.Millisecond, Max: time.Second},
		Logger:         logger,
	})
	if err != nil {
		return err
	}
	if err := client.Start(context.Background()); err != nil {
		return err
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintln(os.Stderr, "prove-workflow-worker:", err)
	}
	return nil
}
