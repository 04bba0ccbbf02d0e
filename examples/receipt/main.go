// Command receipt is Relay's idempotency example: "send the receipt for
// order 123" sends exactly one email per order even when its job runs twice.
//
//	go run ./examples/receipt   # on $DATABASE_URL, else a throwaway PostgreSQL
//
// On $DATABASE_URL it works in a schema of its own, relay_example_receipt,
// dropped and created afresh at each run (and left afterwards for you to
// inspect), so it runs again and again on a shared database.
//
// Two protections work together:
//
//   - the enqueue is unique per order (core.UniqueOpts), so a double-clicked
//     checkout enqueues one job;
//   - the handler sends through idempotency.External, so a job that runs
//     twice (its worker died after sending, before recording success) calls
//     the mail provider again with the same token, which the provider uses
//     to drop the repeat — and a run after the send was recorded does not
//     call it at all.
//
// The "mail provider" here is a local HTTP server that, like real ones,
// deduplicates on the Idempotency-Key header.
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

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/devdb"
	"github.com/relayq/relay/idempotency"
)

// ReceiptArgs is the job: send the receipt for one order.
type ReceiptArgs struct {
	OrderID string `json:"order_id"`
	Email   string `json:"email"`
}

func (ReceiptArgs) Kind() string { return "receipt.send" }

// mailProvider stands in for an email API that deduplicates on its
// Idempotency-Key header, as Stripe-style APIs do.
type mailProvider struct {
	mu       sync.Mutex
	seen     map[string]string // token → message id
	requests int
	sent     int
}

func (m *mailProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests++
	token := r.Header.Get("Idempotency-Key")
	if id, ok := m.seen[token]; ok {
		io.WriteString(w, id) // a repeat: same answer, no second email
		return
	}
	m.sent++
	id := fmt.Sprintf("msg-%d", m.sent)
	m.seen[token] = id
	io.WriteString(w, id)
}

// receiptWorker sends through idempotency.External, keyed by order. The
// first attempt that fails after calling the provider is simulated with
// crashAfterSend.
type receiptWorker struct {
	pool           *pgxpool.Pool
	provider       string
	out            io.Writer
	crashAfterSend bool
	mu             sync.Mutex
}

func (w *receiptWorker) Work(ctx context.Context, job *core.Job[ReceiptArgs]) error {
	msgID, replayed, err := idempotency.External(ctx, w.pool, "receipt", job.Args.OrderID,
		func(ctx context.Context, token string) (string, error) {
			req, _ := http.NewRequestWithContext(ctx, "POST", w.provider, nil)
			req.Header.Set("Idempotency-Key", token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return "", err
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			w.mu.Lock()
			crash := w.crashAfterSend
			w.crashAfterSend = false
			w.mu.Unlock()
			if crash {
				// The email went out, but this attempt dies before Relay
				// records it: the job will run again.
				fmt.Fprintf(w.out, "  attempt %d: sent %s, then crashed before recording it\n", job.Attempt, body)
				return "", errors.New("crashed after sending")
			}
			return string(body), nil
		}, &idempotency.Options{Lease: 5 * time.Second})
	if err != nil {
		return err
	}
	how := "sent"
	if replayed {
		how = "already sent earlier; not sending again"
	}
	fmt.Fprintf(w.out, "  attempt %d: receipt for order %s: %s (%s)\n", job.Attempt, job.Args.OrderID, msgID, how)
	return nil
}

func main() {
	if err := run(context.Background(), os.Getenv("DATABASE_URL"), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "receipt:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url string, out io.Writer) error {
	// A schema of its own, reset at each run: the example runs again and
	// again on a shared DATABASE_URL and never counts another run's rows.
	db, err := devdb.Open(ctx, devdb.Options{URL: url, Schema: "relay_example_receipt", Out: out})
	if err != nil {
		return err
	}
	defer db.Close()
	pool := db.Pool
	provider := &mailProvider{seen: map[string]string{}}
	srv := httptest.NewServer(provider)
	defer srv.Close()

	// Checkout is double-clicked: two enqueues, one job.
	fmt.Fprintln(out, "checkout for order 123, submitted twice:")
	unique := &core.EnqueueOpts{Unique: &core.UniqueOpts{Key: "order-123"}, MaxAttempts: 5}
	var jobID int64
	for range 2 {
		res, err := core.Enqueue(ctx, pool, ReceiptArgs{OrderID: "123", Email: "ada@example.com"}, unique)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "  enqueue: job %d, duplicate=%v\n", res.ID, res.Duplicate)
		jobID = res.ID
	}

	w := &receiptWorker{pool: pool, provider: srv.URL, out: out, crashAfterSend: true}
	workers := core.NewWorkers()
	core.MustAddWorker(workers, core.Worker[ReceiptArgs](w))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	client, err := core.NewClient(pool, &core.Config{Workers: workers, Logger: quiet,
		RetryPolicy: core.Backoff{Base: 50 * time.Millisecond}})
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "running the job:")
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer client.Stop(context.Background())
	for {
		j, err := core.JobGet(ctx, pool, jobID)
		if err != nil {
			return err
		}
		if j.State.Final() {
			fmt.Fprintf(out, "job %d %s after %d attempts\n", j.ID, j.State, j.Attempt)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Later, the receipt is asked for again (a support agent clicks
	// "resend", a replayed event): a new job, since the first finished. The
	// key remembers the send, so nothing goes out.
	fmt.Fprintln(out, "order 123's receipt requested again, later:")
	res, err := core.Enqueue(ctx, pool, ReceiptArgs{OrderID: "123", Email: "ada@example.com"}, unique)
	if err != nil {
		return err
	}
	for {
		j, err := core.JobGet(ctx, pool, res.ID)
		if err != nil {
			return err
		}
		if j.State.Final() {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	provider.mu.Lock()
	defer provider.mu.Unlock()
	fmt.Fprintf(out, "mail provider: %d requests, %d email sent\n", provider.requests, provider.sent)
	return nil
}
