package relaytest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/relaytest"
)

// placeOrder is the code under test: it enqueues a receipt in the
// caller's transaction.
func placeOrder(ctx context.Context, tx pgx.Tx, orderID int64) error {
	_, err := core.Enqueue(ctx, tx, receiptArgs{OrderID: orderID}, &core.EnqueueOpts{Queue: "email"})
	return err
}

// In a test, assert the job exists in the test's transaction (no commit
// needed), then run its worker without a client.
func ExampleRequireEnqueued() {
	var t *testing.T // the test's
	var tx pgx.Tx    // the test's transaction, rolled back at its end
	ctx := context.Background()
	if err := placeOrder(ctx, tx, 42); err != nil {
		t.Fatal(err)
	}
	job := relaytest.RequireEnqueued[receiptArgs](ctx, t, tx, &relaytest.RequireOpts{Queue: "email", Count: 1})
	if err := relaytest.Work(ctx, t, &receiptWorker{}, job.Args, nil); err != nil {
		t.Fatal(err)
	}
}
