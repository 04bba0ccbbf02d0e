// Command payment-flow is Relay's workflow example: charge the payment at
// a fake HTTP provider (once per order, by the step's idempotency key),
// record it, then send the receipt email and write the report as child runs on their
// own queue, then notify once the customer confirms. When the report fails,
// the charge is refunded (a compensation) and the run ends compensated.
//
//	go run ./examples/payment-flow   # on $DATABASE_URL, else a throwaway PostgreSQL
//
// It prints each run's step timeline and its trace id.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/devdb"
	"github.com/relayq/relay/workflow"
)

// Order is the flow's input.
type Order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"` // cents
	Email  string `json:"email"`
	// FailReport makes the report fail, to show the compensation.
	FailReport bool `json:"fail_report"`
}

// Receipt is the flow's output.
type Receipt struct {
	ChargeID  string `json:"charge_id"` // the provider's
	PaymentID int64  `json:"payment_id"`
	EmailID   string `json:"email_id"`
	Report    string `json:"report"`
}

const schema = `
CREATE TABLE IF NOT EXISTS payments (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, order_id text UNIQUE, amount int, charge_id text);
CREATE TABLE IF NOT EXISTS refunds  (order_id text PRIMARY KEY, amount int);
CREATE TABLE IF NOT EXISTS emails   (order_id text PRIMARY KEY, address text, message_id text);
CREATE TABLE IF NOT EXISTS reports  (order_id text PRIMARY KEY, line text);`

func main() {
	if err := run(context.Background(), os.Getenv("DATABASE_URL"), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url string, out io.Writer) error {
	// A schema of its own, reset at each run: the example runs again and
	// again on a shared DATABASE_URL and never counts another run's rows.
	db, err := devdb.Open(ctx, devdb.Options{URL: url, Schema: "relay_example_payment_flow", Out: out})
	if err != nil {
		return err
	}
	defer db.Close()
	pool := db.Pool
	if _, err := pool.Exec(ctx, schema); err != nil {
		return err
	}
	// A tracer provider so that runs get trace ids; export it to Jaeger or
	// any OTLP backend in a real program.
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(ctx) //nolint:errcheck
	reg := workflow.NewRegistry(pool, &workflow.Config{TracerProvider: tp})
	defer reg.Close()

	// The fake payment provider, on loopback: it charges once per
	// Idempotency-Key.
	provider := NewProvider()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: provider, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	defer srv.Close()
	payment, err := register(reg, pool, "http://"+ln.Addr().String())
	if err != nil {
		return err
	}

	ws := core.NewWorkers()
	if err := reg.AddWorkers(ws); err != nil {
		return err
	}
	client, err := core.NewClient(pool, &core.Config{
		Workers:        ws,
		TracerProvider: tp,
		PollInterval:   100 * time.Millisecond,
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		Queues:         map[string]core.QueueConfig{"payments": {MaxWorkers: 4}, "email": {MaxWorkers: 2}},
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer client.Stop(context.Background()) //nolint:errcheck

	orders := []Order{
		{ID: "order-1", Amount: 4200, Email: "ann@example.com"},
		{ID: "order-2", Amount: 990, Email: "bob@example.com", FailReport: true},
	}
	for _, o := range orders {
		// Started in the business transaction: no order, no run.
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		h, err := workflow.Start(ctx, tx, payment, o, &workflow.StartOpts{ID: o.ID, Queue: "payments"})
		if err != nil {
			tx.Rollback(ctx) //nolint:errcheck
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		if !o.FailReport {
			if err := confirm(ctx, pool, h.ID); err != nil {
				return err
			}
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		receipt, err := h.Result(wctx, pool)
		cancel()
		switch {
		case err == nil:
			fmt.Fprintf(out, "%s: completed: payment %d, email %s, report %q\n", h.ID, receipt.PaymentID, receipt.EmailID, receipt.Report)
		case errors.Is(err, workflow.ErrRunCompensated):
			fmt.Fprintf(out, "%s: compensated: %v\n", h.ID, err)
		default:
			return err
		}
		if err := timeline(ctx, pool, h.ID, out); err != nil {
			return err
		}
	}
	var refunds int
	pool.QueryRow(ctx, `SELECT count(*) FROM refunds`).Scan(&refunds) //nolint:errcheck
	fmt.Fprintf(out, "refunds: %d\n", refunds)
	charges := provider.Charges()
	fmt.Fprintf(out, "provider: %d charge requests, charges order-1=%d order-2=%d\n", provider.Requests(), charges["order-1"], charges["order-2"])
	return nil
}

// register registers the flow and its children in reg: the charge goes to
// the provider at providerURL, its other writes to pool.
func register(reg *workflow.Registry, pool *pgxpool.Pool, providerURL string) (*workflow.Workflow[Order, Receipt], error) {
	// The receipt email: a StepTx records the email row with the step, so
	// a retried run never records two.
	sendEmail, err := workflow.Register(reg, "send-email", func(wctx workflow.Context, o Order) (string, error) {
		return workflow.StepTx(wctx, "send", func(ctx context.Context, tx pgx.Tx) (string, error) {
			id := "msg-" + o.ID
			_, err := tx.Exec(ctx, `INSERT INTO emails VALUES ($1, $2, $3)`, o.ID, o.Email, id)
			return id, err
		}, nil)
	})
	if err != nil {
		return nil, err
	}
	writeReport, err := workflow.Register(reg, "write-report", func(wctx workflow.Context, o Order) (string, error) {
		return workflow.StepTx(wctx, "write", func(ctx context.Context, tx pgx.Tx) (string, error) {
			if o.FailReport {
				return "", core.Permanent(errors.New("report store rejected the order"))
			}
			line := fmt.Sprintf("%s paid %d.%02d", o.ID, o.Amount/100, o.Amount%100)
			_, err := tx.Exec(ctx, `INSERT INTO reports VALUES ($1, $2)`, o.ID, line)
			return line, err
		}, nil)
	})
	if err != nil {
		return nil, err
	}
	return workflow.Register(reg, "payment-flow", func(wctx workflow.Context, o Order) (Receipt, error) {
		var r Receipt
		// The charge is an outside call, at least once: a worker killed
		// after the provider charged and before this checkpoint commits
		// calls again. The step's idempotency key is the same on every
		// attempt ("<order>/charge"), so the provider charges once.
		ch, err := workflow.Step(wctx, "charge", func(ctx context.Context) (Charge, error) {
			return charge(ctx, providerURL, workflow.StepIdempotencyKey(ctx), o.ID, o.Amount)
		}, nil)
		if err != nil {
			return r, err
		}
		r.ChargeID = ch.ID
		// The payment's row commits with its checkpoint: recorded exactly once.
		r.PaymentID, err = workflow.StepTx(wctx, "record", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO payments (order_id, amount, charge_id) VALUES ($1, $2, $3) RETURNING id`, o.ID, o.Amount, ch.ID).Scan(&id)
			return id, err
		}, nil)
		if err != nil {
			return r, err
		}
		workflow.Compensate(wctx, "refund", func(ctx context.Context) error {
			_, err := pool.Exec(ctx, `INSERT INTO refunds VALUES ($1, $2) ON CONFLICT DO NOTHING`, o.ID, o.Amount)
			return err
		})
		// Email and report in parallel, on the "email" queue.
		email := workflow.Child(wctx, "email", sendEmail, o, &workflow.ChildOpts{Queue: "email"})
		report := workflow.Child(wctx, "report", writeReport, o, &workflow.ChildOpts{Queue: "email"})
		if r.EmailID, err = email.Get(wctx); err != nil {
			return r, err
		}
		if r.Report, err = report.Get(wctx); err != nil {
			return r, err // the refund runs; the run ends compensated
		}
		workflow.SetEvent(wctx, "status", "waiting for confirmation")
		if err := workflow.Sleep(wctx, "cool-off", 200*time.Millisecond); err != nil {
			return r, err
		}
		if _, ok, err := workflow.WaitSignal[string](wctx, "confirmed", time.Minute); err != nil || !ok {
			return r, errors.Join(err, errors.New("not confirmed in time"))
		}
		return r, nil
	})
}

// confirm waits for the run to publish its status, then sends the signal
// the run waits for (it would be kept if sent earlier, too).
func confirm(ctx context.Context, db core.DB, id string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		status, ok, err := workflow.GetEvent[string](ctx, db, id, "status")
		if err != nil {
			return err
		}
		if ok {
			_ = status
			return workflow.Signal(ctx, db, id, "confirmed", "yes")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("run never asked for confirmation")
}

// timeline prints a run's steps and trace id.
func timeline(ctx context.Context, db core.DB, id string, out io.Writer) error {
	run, err := workflow.Get(ctx, db, id)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  run %s (%s) %s, %d executions, trace %s\n", run.ID, run.Workflow, run.State, run.Executions, traceID(run.TraceParent))
	for _, s := range run.Steps {
		line := fmt.Sprintf("    %2d %-8s %-22s %-10s attempts=%d", s.Position, s.Kind, s.Key, s.State, s.Attempts)
		if s.ChildID != "" {
			line += " child=" + s.ChildID
		}
		if s.Error != "" {
			line += " error=" + s.Error
		}
		fmt.Fprintln(out, line)
	}
	return nil
}

// traceID extracts the trace id from a W3C traceparent.
func traceID(tp string) string {
	if len(tp) >= 35 {
		return tp[3:35]
	}
	return "(untraced)"
}
