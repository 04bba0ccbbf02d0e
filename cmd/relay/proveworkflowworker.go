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
	// Outage: the run books its payment through the ledger (a handled
	// failure, a credit, then a post that fails the run while the ledger
	// is down), to be retried once it is back (--retry-failed).
	Outage bool `json:"outage,omitempty"`
	// Update: the run takes an address update (proveUpdateName) before it
	// waits for its approval; the prover sends it with the approval.
	Update bool `json:"update,omitempty"`
}

// sideIn is a child's input: the payment run it works for.
type sideIn struct {
	Run  string `json:"run"`
	Fail bool   `json:"fail"`
}

const (
	proveSideQueue  = "prove-side"
	proveSignalName = "approval"
	proveUpdateName = "address"
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

// proveStep is the retry policy of the proof's steps: a database fault the
// prover injects (a restart, killed backends) fails a StepTx's
// transaction, and the step must outlast it rather than fail the run.
func proveStep() *workflow.StepOpts {
	return &workflow.StepOpts{MaxAttempts: 20, Retry: core.Backoff{Base: 100 * time.Millisecond, Max: 2 * time.Second}}
}

// own runs one statement of the proof's bookkeeping on the pool (its own
// connection, committed whatever happens next), retrying through the
// database faults the prover injects for up to a minute.
func (e *proveEnv) own(ctx context.Context, what string, fn func(ctx context.Context) error) error {
	return retryDB(ctx, what, fn)
}

// execution records that an execution of the run began (on its own
// connection, committed whatever happens next) and returns its id.
func (e *proveEnv) execution(ctx context.Context, run string) (int64, error) {
	var id int64
	err := e.own(ctx, "record execution of "+run, func(ctx context.Context) error {
		return e.pool.QueryRow(ctx, `INSERT INTO prove_wf_execs (run_id, worker) VALUES ($1, $2) RETURNING id`, run, e.worker).Scan(&id)
	})
	return id, err
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
	return e.own(ctx, "record tried "+kind+" of "+run, func(ctx context.Context) error {
		_, err := e.pool.Exec(ctx, `INSERT INTO prove_wf_tried (run_id, kind, exec_id, worker) VALUES ($1, $2, $3, $4)`, run, kind, exec, e.worker)
		return err
	})
}

// payment: charge → email ∥ report (children on the side queue, the first
// to end chosen by a Select) → sleep → ask → (in.Update) an address
// update → a Select of the approval and a timer → notify. The charge
// registers its refund.
func (e *proveEnv) payment(wctx workflow.Context, in payIn, w proveWorkflows) (string, error) {
	run := wctx.RunID()
	exec, err := e.execution(wctx, run)
	if err != nil {
		return "", err
	}
	if _, err := workflow.StepTx(wctx, "charge", func(ctx context.Context, tx pgx.Tx) (int, error) {
		return 100 + in.Seq, e.effect(ctx, tx, run, "payment", run, exec)
	}, proveStep()); err != nil {
		return "", err
	}
	if in.Outage {
		return e.ledger(wctx, run, exec)
	}
	workflow.Compensate(wctx, "refund", func(ctx context.Context) error {
		// A compensation is an at-least-once step: the refund is written
		// once through idempotency.Once, in the refund's own transaction
		// (retried through the prover's database faults: a compensation
		// has the default attempts only).
		return e.own(ctx, "refund "+run, func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				_, _, err := idempotency.Once(ctx, tx, "prove.refund", run, func(ctx context.Context) (bool, error) {
					return true, e.effect(ctx, tx, run, "refund", run, exec)
				}, nil)
				return err
			})
		})
	})
	email := workflow.Child(wctx, "email", w.email, sideIn{Run: run}, &workflow.ChildOpts{Queue: proveSideQueue})
	report := workflow.Child(wctx, "report", w.report, sideIn{Run: run, Fail: in.Fail}, &workflow.ChildOpts{Queue: proveSideQueue})
	// The first child to end, chosen once (a replay after a kill takes the
	// same branch): both are collected in the same order either way.
	if _, err := workflow.Select(wctx, "first-side", workflow.OnChild(email), workflow.OnChild(report)); err != nil {
		return "", err
	}
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
	}, proveStep()); err != nil {
		return "", err
	}
	// The address update, applied in a StepTx (its effect commits with the
	// step's checkpoint), answered once: a replay calls the handler again
	// with the recorded request, its step answered from history.
	if in.Update {
		handled, err := workflow.HandleUpdate(wctx, proveUpdateName, func(wctx workflow.Context, addr string) (string, error) {
			if _, err := workflow.StepTx(wctx, "apply-address", func(ctx context.Context, tx pgx.Tx) (bool, error) {
				return true, e.effect(ctx, tx, run, "address", run, exec)
			}, proveStep()); err != nil {
				return "", err
			}
			return "applied " + addr, nil
		}, &workflow.UpdateOpts[string]{Timeout: 5 * time.Minute})
		if err != nil {
			return "", err
		}
		if !handled {
			return "", core.Permanent(errors.New("payment: no address update within 5 minutes"))
		}
	}
	// The approval, or 5 minutes: a Select of a signal and a timer, its
	// choice checkpointed with the signal it consumed.
	approve := workflow.OnSignal[string](proveSignalName)
	chosen, err := workflow.Select(wctx, "approval", approve, workflow.OnTimer(5*time.Minute))
	if err != nil {
		return "", err
	}
	if chosen != 0 {
		return "", core.Permanent(errors.New("payment: no approval within 5 minutes"))
	}
	approval := approve.Payload()
	if _, err := workflow.StepTx(wctx, "notify", func(ctx context.Context, tx pgx.Tx) (bool, error) {
		return true, e.effect(ctx, tx, run, "notify", run, exec)
	}, proveStep()); err != nil {
		return "", err
	}
	return approval, nil
}

// ledger is the rest of an outage run: a fraud check that fails and is
// handled (the run goes on without it), the credit in a StepTx, then the
// post, which fails the run for good while the ledger is down (no
// compensation is registered on this path: the run ends failed). Retried
// once the ledger is back, the run resumes at the post: the charge and the
// credit, committed before the failure, are never written again.
func (e *proveEnv) ledger(wctx workflow.Context, run string, exec int64) (string, error) {
	if _, err := workflow.Step(wctx, "fraud-check", func(ctx context.Context) (bool, error) {
		return false, core.Permanent(errors.New("fraud-check: the fraud service is unavailable"))
	}, nil); err == nil {
		return "", core.Permanent(errors.New("ledger: the fraud check cannot succeed"))
	}
	if _, err := workflow.StepTx(wctx, "credit", func(ctx context.Context, tx pgx.Tx) (bool, error) {
		return true, e.effect(ctx, tx, run, "credit", run, exec)
	}, proveStep()); err != nil {
		return "", err
	}
	return workflow.Step(wctx, "post", func(ctx context.Context) (string, error) {
		var down bool
		if err := e.own(ctx, "read the ledger's state", func(ctx context.Context) error {
			return e.pool.QueryRow(ctx, `SELECT down FROM prove_wf_ledger`).Scan(&down)
		}); err != nil {
			return "", err
		}
		if down {
			return "", core.Permanent(errors.New("post: the ledger is down"))
		}
		return "posted", nil
	}, nil)
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
	}, proveStep()); err != nil {
		return "", err
	}
	token := workflow.UUID(wctx, "token").String()
	return workflow.Step(wctx, "send", func(ctx context.Context) (string, error) {
		// The sink records the call in the prover's database, which the
		// prover may be restarting: proveStep's policy retries a refused call.
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
	}, proveSendStep())
}

// proveSendStep is proveStep with a start-to-close timeout on each
// attempt: a sink call stalled by a fault fails at 10 s and is retried.
func proveSendStep() *workflow.StepOpts {
	o := proveStep()
	o.Timeout = 10 * time.Second
	return o
}

// runProveWorkflowWorker is one worker process of `relay prove workflow`:
// a core client serving the payment queue and the side queue, executing the
// proof's workflows, until SIGTERM.
func runProveWorkflowWorker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prove-workflow-worker", flag.ContinueOnError)
	dbURL := fs.String("database-url", "", "PostgreSQL URL")
	listenerURL := fs.String("listener-url", "", "PostgreSQL URL of the LISTEN connection (default: --database-url's)")
	id := fs.String("id", "", "worker id")
	sinkURL := fs.String("sink", "", "sink URL")
	concurrency := fs.Int("concurrency", 8, "executions at once per queue")
	lease := fs.Duration("lease", 2*time.Second, "lease")
	stepTime := fs.Duration("step-time", 20*time.Millisecond, "how long each StepTx body takes (a payment gateway)")
	appName := fs.String("app-name", "relay-prove-worker", "application_name of the worker's connections")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(*dbURL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = *appName
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
		Workers:     ws,
		ID:          *id,
		ListenerURL: *listenerURL,
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
