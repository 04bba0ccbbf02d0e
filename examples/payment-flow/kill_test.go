package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// Environment of the worker process TestOneChargePerOrderUnderKill starts.
const (
	workerDBEnv       = "RELAY_PAYMENT_WORKER_DB"
	workerProviderEnv = "RELAY_PAYMENT_WORKER_PROVIDER"
)

// TestPaymentWorkerProcess is not a test: it is the worker process that
// TestOneChargePerOrderUnderKill starts (and kills). It executes the flow
// until its standard input closes.
func TestPaymentWorkerProcess(t *testing.T) {
	url := os.Getenv(workerDBEnv)
	if url == "" {
		t.Skip("the worker process of TestOneChargePerOrderUnderKill")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reg := workflow.NewRegistry(pool, &workflow.Config{
		ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 50 * time.Millisecond }),
	})
	defer reg.Close()
	if _, err := register(reg, pool, os.Getenv(workerProviderEnv)); err != nil {
		t.Fatal(err)
	}
	ws := core.NewWorkers()
	if err := reg.AddWorkers(ws); err != nil {
		t.Fatal(err)
	}
	// A short lease, so that the next worker takes over a killed one's
	// runs soon.
	client, err := core.NewClient(pool, &core.Config{
		Workers: ws, LeaseDuration: 2 * time.Second, RescueInterval: 200 * time.Millisecond,
		PollInterval: 50 * time.Millisecond,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		Queues:       map[string]core.QueueConfig{"payments": {MaxWorkers: 4}, "email": {MaxWorkers: 4}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, os.Stdin) //nolint:errcheck // until the test closes it
	stop, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	client.Stop(stop) //nolint:errcheck
}

// Orders flow through worker processes while the worker is killed
// (SIGKILL) right after the provider charged and before it answered: the
// step's checkpoint never commits, and the next worker calls the provider
// again with the same idempotency key. Every order is charged exactly once,
// and the provider saw the repeats it deduplicated.
func TestOneChargePerOrderUnderKill(t *testing.T) {
	ctx := context.Background()
	url := testdb.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, schema); err != nil {
		t.Fatal(err)
	}

	// The worker process of the moment; kill replaces it.
	var mu sync.Mutex
	var worker *exec.Cmd
	var workerIn io.WriteCloser
	var providerURL string
	startWorker := func() {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPaymentWorkerProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), workerDBEnv+"="+url, workerProviderEnv+"="+providerURL)
		cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Error(err)
			return
		}
		if err := cmd.Start(); err != nil {
			t.Error(err)
			return
		}
		worker, workerIn = cmd, in
	}
	const orders, kills = 12, 3
	killed := 0
	provider := NewProvider()
	provider.OnCharge = func(c Charge) {
		mu.Lock()
		defer mu.Unlock()
		if killed == kills || (c.Order != "order-2" && c.Order != "order-6" && c.Order != "order-10") {
			return
		}
		// The charge is made and its answer not yet sent: the worker
		// dies without it.
		worker.Process.Kill() //nolint:errcheck
		worker.Wait()         //nolint:errcheck
		killed++
		startWorker()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: provider, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { srv.Close() })
	providerURL = "http://" + ln.Addr().String()

	mu.Lock()
	startWorker()
	mu.Unlock()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		workerIn.Close()
		done := make(chan struct{})
		go func() { worker.Wait(); close(done) }() //nolint:errcheck
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			worker.Process.Kill() //nolint:errcheck
		}
	})

	// This process only starts runs: its registry executes nothing.
	reg := workflow.NewRegistry(pool, nil)
	t.Cleanup(reg.Close)
	payment, err := register(reg, pool, providerURL)
	if err != nil {
		t.Fatal(err)
	}
	var handles []workflow.Handle[Receipt]
	for i := range orders {
		o := Order{ID: fmt.Sprintf("order-%d", i), Amount: 100 + i, Email: "x@example.com"}
		h, err := workflow.Start(ctx, pool, payment, o, &workflow.StartOpts{ID: o.ID, Queue: "payments"})
		if err != nil {
			t.Fatal(err)
		}
		// The confirmation waits in the mailbox until the run asks.
		if err := workflow.Signal(ctx, pool, h.ID, "confirmed", "yes"); err != nil {
			t.Fatal(err)
		}
		handles = append(handles, h)
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for _, h := range handles {
		if _, err := h.Result(wctx, pool); err != nil {
			t.Fatalf("run %s: %v", h.ID, err)
		}
	}
	mu.Lock()
	if killed != kills {
		t.Errorf("%d kills, want %d", killed, kills)
	}
	mu.Unlock()
	charges := provider.Charges()
	for i := range orders {
		if n := charges[fmt.Sprintf("order-%d", i)]; n != 1 {
			t.Errorf("order-%d charged %d times, want 1", i, n)
		}
	}
	if len(charges) != orders {
		t.Errorf("charges for %d orders, want %d: %v", len(charges), orders, charges)
	}
	// Each kill lost one answer at least, asked for again under the same key.
	if n := provider.Requests(); n < orders+kills {
		t.Errorf("%d charge requests for %d orders and %d kills: the killed workers' charges were not asked for again", n, orders, kills)
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM payments`); n != orders {
		t.Errorf("%d payment rows, want %d", n, orders)
	}
}
