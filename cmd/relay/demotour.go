package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/scheduler"
	"github.com/relayq/relay/workflow"
)

// The demo's business tables, in a schema of their own beside Relay's.
const demoSchema = `
CREATE SCHEMA IF NOT EXISTS relay_demo;
CREATE TABLE IF NOT EXISTS relay_demo.payments (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, order_id text UNIQUE, cents int);
CREATE TABLE IF NOT EXISTS relay_demo.refunds  (order_id text PRIMARY KEY, cents int);
CREATE TABLE IF NOT EXISTS relay_demo.emails   (order_id text PRIMARY KEY, address text);
CREATE TABLE IF NOT EXISTS relay_demo.reports  (order_id text PRIMARY KEY, line text);`

// demoOrder is the payment workflow's input.
type demoOrder struct {
	ID    string `json:"id"`
	Cents int    `json:"cents"`
	Email string `json:"email"`
	// FailReport makes the report fail, to show the compensation.
	FailReport bool `json:"fail_report"`
}

// demoReceipt is the payment workflow's output.
type demoReceipt struct {
	PaymentID int64  `json:"payment_id"`
	Report    string `json:"report"`
}

// settleArgs is the month-end settlement schedule's job.
type settleArgs struct {
	Ledger string `json:"ledger"`
}

func (settleArgs) Kind() string { return "demo.settle" }

// receiptArgs is the outbox subscriber's job: one per order.paid event.
type receiptArgs struct{ outbox.Delivery }

func (receiptArgs) Kind() string { return "demo.receipt" }

const (
	demoNamespace    = "relay-demo"
	demoScheduleName = "month-end-settlement"
	demoScheduleSpec = "0 18 L * *" // 18:00 on the last day of every month
	demoScheduleZone = "Europe/Paris"
	demoTopic        = "order.paid"
)

// demoTour runs the demo's parts on one client, registry, scheduler and
// dispatcher.
type demoTour struct {
	pool  *pgxpool.Pool
	tp    *sdktrace.TracerProvider
	stamp string // makes this demo's run ids its own on a shared database (to the millisecond: two demos can start within one second)

	client     *core.Client
	reg        *workflow.Registry
	payment    *workflow.Workflow[demoOrder, demoReceipt]
	sched      *scheduler.Scheduler
	dispatcher *outbox.Dispatcher
}

func (t *demoTour) setUp(ctx context.Context) error {
	if _, err := t.pool.Exec(ctx, demoSchema); err != nil {
		return fmt.Errorf("create the demo's tables: %w", err)
	}
	t.reg = workflow.NewRegistry(t.pool, &workflow.Config{TracerProvider: t.tp, Logger: demoQuiet()})
	t.registerPayment()
	ws := core.NewWorkers()
	if err := t.reg.AddWorkers(ws); err != nil {
		return err
	}
	core.MustAddWorker(ws, core.WorkFunc[greetArgs](func(ctx context.Context, j *core.Job[greetArgs]) error {
		fmt.Printf("  job %d %s: hello, %s\n", j.ID, j.Kind, j.Args.Name)
		return nil
	}))
	core.MustAddWorker(ws, core.WorkFunc[flakyArgs](func(ctx context.Context, j *core.Job[flakyArgs]) error {
		if j.Attempt <= j.Args.FailTimes {
			fmt.Printf("  job %d %s: attempt %d fails on purpose\n", j.ID, j.Kind, j.Attempt)
			return fmt.Errorf("upstream unavailable (attempt %d)", j.Attempt)
		}
		fmt.Printf("  job %d %s: attempt %d succeeds\n", j.ID, j.Kind, j.Attempt)
		return nil
	}))
	core.MustAddWorker(ws, core.WorkFunc[doomedArgs](func(ctx context.Context, j *core.Job[doomedArgs]) error {
		fmt.Printf("  job %d %s: attempt %d of %d fails\n", j.ID, j.Kind, j.Attempt, j.MaxAttempts)
		return errors.New("the card was declined")
	}))
	core.MustAddWorker(ws, core.WorkFunc[settleArgs](func(ctx context.Context, j *core.Job[settleArgs]) error {
		fmt.Printf("  job %d %s: settled ledger %q\n", j.ID, j.Kind, j.Args.Ledger)
		return nil
	}))
	core.MustAddWorker(ws, core.WorkFunc[receiptArgs](func(ctx context.Context, j *core.Job[receiptArgs]) error {
		var o demoOrder
		if err := j.Args.Decode(&o); err != nil {
			return core.Permanent(err)
		}
		fmt.Printf("  job %d %s: receipt for %s (event %d) sent to %s\n", j.ID, j.Kind, o.ID, j.Args.EventID, o.Email)
		return nil
	}))
	var err error
	t.client, err = core.NewClient(t.pool, &core.Config{
		Workers:        ws,
		TracerProvider: t.tp,
		PollInterval:   100 * time.Millisecond,
		RetryPolicy:    core.Backoff{Base: 200 * time.Millisecond, Max: time.Second},
		Queues:         map[string]core.QueueConfig{"demo": {MaxWorkers: 4}, "payments": {MaxWorkers: 4}, "email": {MaxWorkers: 2}},
		Logger:         demoQuiet(),
	})
	if err != nil {
		return err
	}
	if err := t.client.Start(ctx); err != nil {
		return err
	}
	return nil
}

func (t *demoTour) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t.client.Stop(ctx) //nolint:errcheck // shutting down
	t.reg.Close()
}

// registerPayment registers payment → (email ∥ report as child runs) →
// wait for the customer's confirmation, with the charge refunded when the
// report fails.
func (t *demoTour) registerPayment() {
	pool := t.pool
	email := workflow.MustRegister(t.reg, "demo.send-email", func(wctx workflow.Context, o demoOrder) (string, error) {
		return workflow.StepTx(wctx, "send", func(ctx context.Context, tx pgx.Tx) (string, error) {
			_, err := tx.Exec(ctx, `INSERT INTO relay_demo.emails VALUES ($1, $2) ON CONFLICT DO NOTHING`, o.ID, o.Email)
			return "sent to " + o.Email, err
		}, nil)
	})
	report := workflow.MustRegister(t.reg, "demo.write-report", func(wctx workflow.Context, o demoOrder) (string, error) {
		return workflow.StepTx(wctx, "write", func(ctx context.Context, tx pgx.Tx) (string, error) {
			if o.FailReport {
				return "", core.Permanent(errors.New("the report store rejected the order"))
			}
			line := fmt.Sprintf("%s paid %d.%02d EUR", o.ID, o.Cents/100, o.Cents%100)
			_, err := tx.Exec(ctx, `INSERT INTO relay_demo.reports VALUES ($1, $2) ON CONFLICT DO NOTHING`, o.ID, line)
			return line, err
		}, nil)
	})
	t.payment = workflow.MustRegister(t.reg, "demo.payment", func(wctx workflow.Context, o demoOrder) (demoReceipt, error) {
		var r demoReceipt
		var err error
		// The charge's row commits with its checkpoint: charged once.
		r.PaymentID, err = workflow.StepTx(wctx, "charge", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO relay_demo.payments (order_id, cents) VALUES ($1, $2) RETURNING id`, o.ID, o.Cents).Scan(&id)
			return id, err
		}, nil)
		if err != nil {
			return r, err
		}
		workflow.Compensate(wctx, "refund", func(ctx context.Context) error {
			_, err := pool.Exec(ctx, `INSERT INTO relay_demo.refunds VALUES ($1, $2) ON CONFLICT DO NOTHING`, o.ID, o.Cents)
			return err
		})
		mail := workflow.Child(wctx, "email", email, o, &workflow.ChildOpts{Queue: "email"})
		rep := workflow.Child(wctx, "report", report, o, &workflow.ChildOpts{Queue: "email"})
		if _, err = mail.Get(wctx); err != nil {
			return r, err
		}
		if r.Report, err = rep.Get(wctx); err != nil {
			return r, err // the refund runs; the run ends compensated
		}
		workflow.SetEvent(wctx, "status", "waiting for the customer's confirmation") //nolint:errcheck // shown, not needed
		if _, ok, err := workflow.WaitSignal[string](wctx, "confirmed", 7*24*time.Hour); err != nil || !ok {
			return r, errors.Join(err, errors.New("not confirmed within a week"))
		}
		return r, nil
	})
}

// jobs enqueues the three plain jobs in one transaction, the flaky one under
// a span so that its three attempts share one trace, and waits for them.
func (t *demoTour) jobs(ctx context.Context) error {
	fmt.Println("\ndemo: 1. jobs — enqueued in one transaction; one succeeds, one is retried twice (one trace across its attempts), one ends dead")
	tx, err := t.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	opts := &core.EnqueueOpts{Queue: "demo"}
	greet, err := core.Enqueue(ctx, tx, greetArgs{Name: "world"}, opts)
	if err != nil {
		return err
	}
	sctx, span := t.tp.Tracer("relay-demo").Start(ctx, "demo checkout")
	flaky, err := core.Enqueue(sctx, tx, flakyArgs{FailTimes: 2}, opts)
	span.End()
	if err != nil {
		return err
	}
	doomed, err := core.Enqueue(ctx, tx, doomedArgs{}, &core.EnqueueOpts{Queue: "demo", MaxAttempts: 3})
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	ids := []int64{greet.ID, flaky.ID, doomed.ID}
	if err := waitJobs(ctx, t.pool, ids, time.Minute); err != nil {
		return err
	}
	for _, id := range ids {
		j, err := core.JobGet(ctx, t.pool, id)
		if err != nil {
			return err
		}
		fmt.Printf("  job %d %-11s %-9s after %d attempt(s), trace %s\n", j.ID, j.Kind, j.State, j.Attempt, traceOf(j))
		for _, h := range j.History {
			fmt.Printf("      attempt %d failed: %s\n", h.Attempt, h.Error)
		}
	}
	return nil
}

// workflows starts three payment runs in the orders' transactions: one
// confirmed (completed), one whose report fails (compensated: refunded),
// one left waiting for its confirmation signal.
func (t *demoTour) workflows(ctx context.Context) error {
	fmt.Println("\ndemo: 2. workflows — payment → email ∥ report (child runs) → the customer's confirmation")
	orders := []struct {
		o       demoOrder
		confirm bool
	}{
		{demoOrder{ID: "order-1-" + t.stamp, Cents: 4200, Email: "ann@example.com"}, true},
		{demoOrder{ID: "order-2-" + t.stamp, Cents: 990, Email: "bob@example.com", FailReport: true}, false},
		{demoOrder{ID: "order-3-" + t.stamp, Cents: 1500, Email: "cy@example.com"}, false},
	}
	for _, c := range orders {
		tx, err := t.pool.Begin(ctx)
		if err != nil {
			return err
		}
		h, err := workflow.Start(ctx, tx, t.payment, c.o, &workflow.StartOpts{ID: c.o.ID, Queue: "payments"})
		if err != nil {
			tx.Rollback(ctx) //nolint:errcheck
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		switch {
		case c.confirm:
			err = t.waitStatus(wctx, h.ID)
			if err == nil {
				err = workflow.Signal(wctx, t.pool, h.ID, "confirmed", "yes")
			}
			if err == nil {
				var r demoReceipt
				if r, err = h.Result(wctx, t.pool); err == nil {
					fmt.Printf("  run %s: completed (payment %d, report %q)\n", h.ID, r.PaymentID, r.Report)
				}
			}
		case c.o.FailReport:
			_, err = h.Result(wctx, t.pool)
			if errors.Is(err, workflow.ErrRunCompensated) {
				fmt.Printf("  run %s: compensated: the report failed, the charge was refunded\n", h.ID)
				err = nil
			} else if err == nil {
				err = fmt.Errorf("run %s completed; it should have been compensated", h.ID)
			}
		default:
			if err = t.waitStatus(wctx, h.ID); err == nil {
				fmt.Printf("  run %s: waiting for the signal \"confirmed\" (send it from the dashboard or workflow.Signal)\n", h.ID)
			}
		}
		cancel()
		if err != nil {
			return fmt.Errorf("run %s: %w", h.ID, err)
		}
		if err := printTimeline(ctx, t.pool, h.ID); err != nil {
			return err
		}
	}
	return nil
}

// waitStatus waits until the run has published its status: it is then
// waiting for its confirmation.
func (t *demoTour) waitStatus(ctx context.Context, id string) error {
	for {
		_, ok, err := workflow.GetEvent[string](ctx, t.pool, id, "status")
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the run never asked for its confirmation: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// printTimeline prints a run's state and steps.
func printTimeline(ctx context.Context, pool *pgxpool.Pool, id string) error {
	run, err := workflow.Get(ctx, pool, id)
	if err != nil {
		return err
	}
	fmt.Printf("      %s %s, trace %s:", run.Workflow, run.State, orUntraced(traceID(run.TraceParent)))
	var steps []string
	for _, s := range run.Steps {
		steps = append(steps, s.Key+"="+string(s.State))
	}
	fmt.Println(" " + strings.Join(steps, " "))
	return nil
}

// schedule declares the month-end settlement schedule and fires it once now
// (it would otherwise fire at 18:00 Paris time on the month's last day).
func (t *demoTour) schedule(ctx context.Context) error {
	fmt.Printf("\ndemo: 3. a schedule — %q (%s, %s): settle the ledger at 18:00 on the last day of the month\n", demoScheduleName, demoScheduleSpec, demoScheduleZone)
	var err error
	t.sched, err = scheduler.New(t.pool, &scheduler.Config{
		Namespace: demoNamespace,
		Logger:    demoQuiet(),
		Schedules: []scheduler.Schedule{{
			Name: demoScheduleName, Spec: demoScheduleSpec, TimeZone: demoScheduleZone,
			Args: settleArgs{Ledger: "main"}, Opts: &core.EnqueueOpts{Queue: "demo"},
			CatchUp: scheduler.CatchUpLatest, Overlap: scheduler.OverlapSkip,
		}},
	})
	if err != nil {
		return err
	}
	// Declared, not started: the schedule stays in the database for the
	// dashboard; a process that runs it (Start) fires it at month end.
	if err := t.sched.Declare(ctx); err != nil {
		return err
	}
	list, err := scheduler.List(ctx, t.pool)
	if err != nil {
		return err
	}
	for _, s := range list {
		if s.Name == demoScheduleName {
			fmt.Printf("  next fire %s\n", s.NextFireAt.In(mustZone(demoScheduleZone)).Format("Mon 2006-01-02 15:04 MST"))
		}
	}
	res, err := scheduler.TriggerNow(ctx, t.pool, demoScheduleName)
	if err != nil {
		return err
	}
	fmt.Printf("  triggered now, as an operator would from the dashboard: job %d\n", res.ID)
	return waitJobs(ctx, t.pool, []int64{res.ID}, time.Minute)
}

// outbox publishes an order.paid event in each of two business
// transactions and dispatches them: each becomes one demo.receipt job, in
// order per customer.
func (t *demoTour) outbox(ctx context.Context) error {
	fmt.Printf("\ndemo: 4. outbox events — %q published in the business transaction, one demo.receipt job per event\n", demoTopic)
	var err error
	t.dispatcher, err = outbox.NewDispatcher(t.pool, &outbox.Config{
		Namespace: demoNamespace, Logger: demoQuiet(), TracerProvider: t.tp,
		Subscriptions: []outbox.Subscription{{Topic: demoTopic, Kind: receiptArgs{}.Kind(), Opts: &core.EnqueueOpts{Queue: "demo"}}},
	})
	if err != nil {
		return err
	}
	if err := t.dispatcher.Declare(ctx); err != nil {
		return err
	}
	for _, o := range []demoOrder{
		{ID: "order-4-" + t.stamp, Cents: 2500, Email: "dee@example.com"},
		{ID: "order-5-" + t.stamp, Cents: 700, Email: "dee@example.com"},
	} {
		err := pgx.BeginFunc(ctx, t.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO relay_demo.payments (order_id, cents) VALUES ($1, $2)`, o.ID, o.Cents); err != nil {
				return err
			}
			id, err := outbox.Publish(ctx, tx, outbox.Event{Topic: demoTopic, Key: o.Email, Payload: o})
			if err == nil {
				fmt.Printf("  published event %d for %s with its payment row\n", id, o.ID)
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	n, err := t.dispatcher.DispatchOnce(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("  dispatched %d event(s) into jobs\n", n)
	rows, err := t.pool.Query(ctx, `SELECT id FROM relay_jobs WHERE kind = $1 AND state NOT IN ('succeeded', 'dead', 'cancelled')`, receiptArgs{}.Kind())
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return err
	}
	return waitJobs(ctx, t.pool, ids, time.Minute)
}

// traceID is the trace id of a W3C traceparent (version-traceid-spanid-
// flags), or "".
func traceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	return parts[1]
}

func orUntraced(id string) string {
	if id == "" {
		return "(untraced)"
	}
	return id
}

// mustZone loads a zone the demo names; without the zone database, UTC.
func mustZone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		return time.UTC
	}
	return loc
}
