// Command checkout is Relay's outbox example: an order is committed with a
// payment.succeeded event in the same transaction; the event fans out to a
// receipt job and to a signed webhook received by a local "shop" server
// that verifies every delivery.
//
//	go run ./examples/checkout   # on $DATABASE_URL, else a throwaway PostgreSQL
//
// On $DATABASE_URL it works in a schema of its own, relay_example_checkout,
// dropped and created afresh at each run (and left afterwards for you to
// inspect), so it runs again and again on a shared database.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/devdb"
	"github.com/relayq/relay/outbox"
)

// Payment is the event's payload.
type Payment struct {
	OrderID string `json:"order_id"`
	Cents   int    `json:"cents"`
}

// SendReceipt is the receipt subscriber's job.
type SendReceipt struct{ outbox.Delivery }

func (SendReceipt) Kind() string { return "receipt.send" }

func main() {
	if err := run(context.Background(), os.Getenv("DATABASE_URL"), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "checkout:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url string, w io.Writer) error {
	out := &lockedWriter{w: w} // the receipt job and the webhook receiver print at once
	// A schema of its own, reset at each run: the example runs again and
	// again on a shared DATABASE_URL and never counts another run's rows.
	db, err := devdb.Open(ctx, devdb.Options{URL: url, Schema: "relay_example_checkout", Out: out})
	if err != nil {
		return err
	}
	defer db.Close()
	pool := db.Pool
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, cents int NOT NULL, paid bool NOT NULL)`); err != nil {
		return err
	}

	// The shop's webhook receiver: verifies the signature, then accepts.
	secret := []byte("shop-webhook-secret-0123456789")
	var mu sync.Mutex
	var received []string
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := outbox.VerifyRequest(r, secret)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		mu.Lock()
		received = append(received, string(body))
		mu.Unlock()
		fmt.Fprintf(out, "  shop webhook: verified %s event %s: %s\n", r.Header.Get(outbox.HeaderTopic), r.Header.Get(outbox.HeaderEventID), body)
	}))
	defer shop.Close()

	hooks, err := outbox.NewWebhookWorker(outbox.Endpoint{Name: "shop", URL: shop.URL, Secret: secret, Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	done := make(chan struct{}, 2)
	workers := core.NewWorkers()
	core.MustAddWorker(workers, core.Worker[outbox.WebhookArgs](webhookDone{hooks, done}))
	core.MustAddWorker(workers, core.WorkFunc[SendReceipt](func(ctx context.Context, j *core.Job[SendReceipt]) error {
		var p Payment
		if err := j.Args.Decode(&p); err != nil {
			return core.Permanent(err)
		}
		fmt.Fprintf(out, "  receipt job: emailing the receipt for order %s (%d cents)\n", p.OrderID, p.Cents)
		done <- struct{}{}
		return nil
	}))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	client, err := core.NewClient(pool, &core.Config{Workers: workers, Logger: quiet})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer client.Stop(context.Background())
	dispatcher, err := outbox.NewDispatcher(pool, &outbox.Config{Logger: quiet, Subscriptions: []outbox.Subscription{
		{Topic: "payment.succeeded", Kind: "receipt.send"},
		{Topic: "payment.succeeded", Endpoint: "shop"},
	}})
	if err != nil {
		return err
	}
	if err := dispatcher.Start(ctx); err != nil {
		return err
	}
	defer dispatcher.Stop(context.Background())

	// A checkout whose card is declined rolls back: no order, no event.
	fmt.Fprintln(out, "checkout of order 41: card declined, transaction rolled back")
	err = checkout(ctx, pool, Payment{OrderID: "41", Cents: 500}, errors.New("card declined"))
	if err == nil {
		return errors.New("the declined checkout committed")
	}
	// A successful one commits the order and its event together.
	fmt.Fprintln(out, "checkout of order 42: paid, order and event committed together")
	if err := checkout(ctx, pool, Payment{OrderID: "42", Cents: 1999}, nil); err != nil {
		return err
	}
	for range 2 {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			return errors.New("the event's jobs did not run")
		}
	}
	var events int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_outbox`).Scan(&events); err != nil {
		return err
	}
	fmt.Fprintf(out, "events in the outbox: %d (the rolled-back checkout left none)\n", events)
	return nil
}

// checkout writes the order and publishes payment.succeeded in one
// transaction; fail makes it roll back.
func checkout(ctx context.Context, pool *pgxpool.Pool, p Payment, fail error) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, cents, paid) VALUES ($1, $2, true)`, p.OrderID, p.Cents); err != nil {
			return err
		}
		if _, err := outbox.Publish(ctx, tx, outbox.Event{Topic: "payment.succeeded", Key: "order-" + p.OrderID, Payload: p}); err != nil {
			return err
		}
		return fail
	})
}

// webhookDone signals each delivered webhook (for the example's ending).
type webhookDone struct {
	*outbox.WebhookWorker
	done chan<- struct{}
}

func (w webhookDone) Work(ctx context.Context, j *core.Job[outbox.WebhookArgs]) error {
	if err := w.WebhookWorker.Work(ctx, j); err != nil {
		return err
	}
	w.done <- struct{}{}
	return nil
}

// lockedWriter serialises writes from concurrent goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
