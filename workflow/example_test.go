package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

type Order struct {
	ID     string
	Amount int
}

// A payment flow: the charge commits with its checkpoint, a refund is
// registered as its compensation, the receipt goes out after a durable
// cool-off, and the run waits for a confirmation signal.
func ExampleRegister() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://localhost/app")
	reg := workflow.NewRegistry(pool, nil)
	pay := workflow.MustRegister(reg, "payment", func(wctx workflow.Context, o Order) (string, error) {
		charge, err := workflow.StepTx(wctx, "charge", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO payments (order_id, amount) VALUES ($1, $2) RETURNING id`, o.ID, o.Amount).Scan(&id)
			return id, err
		}, nil)
		if err != nil {
			return "", err
		}
		workflow.Compensate(wctx, "refund", func(ctx context.Context) error {
			_, err := pool.Exec(ctx, `INSERT INTO refunds (payment_id) VALUES ($1) ON CONFLICT DO NOTHING`, charge)
			return err
		})
		if err := workflow.Sleep(wctx, "cool-off", time.Minute); err != nil {
			return "", err
		}
		if _, ok, err := workflow.WaitSignal[bool](wctx, "confirmed", 24*time.Hour); err != nil || !ok {
			return "", fmt.Errorf("not confirmed: %v", err)
		}
		return workflow.Step(wctx, "receipt", func(ctx context.Context) (string, error) {
			return "receipt for " + o.ID, nil // call the mail API here, keyed by o.ID
		}, nil)
	})

	ws := core.NewWorkers()
	reg.AddWorkers(ws)
	client, _ := core.NewClient(pool, &core.Config{Workers: ws})
	client.Start(ctx)
	defer client.Stop(ctx)

	tx, _ := pool.Begin(ctx)
	h, _ := workflow.Start(ctx, tx, pay, Order{ID: "order-42", Amount: 4200}, &workflow.StartOpts{ID: "order-42"})
	tx.Commit(ctx) // the run exists only if the order's transaction commits

	workflow.Signal(ctx, pool, h.ID, "confirmed", true)
	receipt, err := h.Result(ctx, pool)
	fmt.Println(receipt, err)
}

// ErrCardDeclined is a sentinel a payment workflow branches on.
var ErrCardDeclined = errors.New("payments: card declined")

// A workflow that branches on a step's error: the error is declared, so
// errors.Is answers the same on the execution that ran the step and on
// every replay of it.
func ExampleRegistry_DeclareError() {
	reg := workflow.NewRegistry(nil, nil)
	if err := reg.DeclareError("card_declined", ErrCardDeclined); err != nil {
		panic(err) // a code or sentinel declared twice
	}
	workflow.MustRegister(reg, "checkout", func(wctx workflow.Context, o Order) (string, error) {
		_, err := workflow.Step(wctx, "charge", func(ctx context.Context) (int, error) {
			return 0, core.Permanent(fmt.Errorf("gateway: %w", ErrCardDeclined)) // as a payment API client would
		}, nil)
		if errors.Is(err, ErrCardDeclined) {
			return "ask for another card", nil
		}
		// A *workflow.Error carries a type and details the workflow reads.
		var app *workflow.Error
		if errors.As(err, &app) && app.Type == "fraud_suspected" {
			return "review " + string(app.Details), nil
		}
		return "paid", err
	})
	fmt.Println(reg.Registered("checkout"))
	// Output: true
}
