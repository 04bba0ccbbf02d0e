package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/testdb"
	"github.com/relayq/relay/outbox"
)

var secret = []byte("0123456789abcdef-shared-secret")

// An event fans out to a signed webhook: the receiver verifies every
// delivery; two 500s are retried with the core's backoff, and the status
// and body excerpt land in the job's history.
func TestWebhookDelivery(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	var calls atomic.Int32
	var got atomic.Value
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := outbox.VerifyRequest(r, secret)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if calls.Add(1) <= 2 {
			http.Error(w, "receiver down for maintenance", http.StatusInternalServerError)
			return
		}
		got.Store(string(body))
	}))
	defer receiver.Close()

	hooks, err := outbox.NewWebhookWorker(outbox.Endpoint{Name: "shop", URL: receiver.URL, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.Worker[outbox.WebhookArgs](hooks))
	c, err := core.NewClient(pool, &core.Config{Workers: ws, PollInterval: 20 * time.Millisecond,
		RetryPolicy: core.Backoff{Base: 10 * time.Millisecond, Max: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	d, err := outbox.NewDispatcher(pool, &outbox.Config{Subscriptions: []outbox.Subscription{{Topic: "payment.succeeded", Endpoint: "shop"}}})
	if err != nil {
		t.Fatal(err)
	}
	id, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "payment.succeeded", Key: "o-5", Payload: payment{"o-5", 99}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.DispatchOnce(ctx); err != nil {
		t.Fatal(err)
	}
	testdb.WaitFor(t, "the webhook to succeed", func() bool { return c.Stats().Succeeded == 1 })
	if calls.Load() != 3 {
		t.Errorf("%d calls, want 3 (two 500s, then success)", calls.Load())
	}
	var body struct {
		ID      int64   `json:"id"`
		Topic   string  `json:"topic"`
		Payload payment `json:"payload"`
	}
	if err := json.Unmarshal([]byte(got.Load().(string)), &body); err != nil || body.ID != id || body.Topic != "payment.succeeded" || body.Payload.Amount != 99 {
		t.Errorf("receiver got %s (%v)", got.Load(), err)
	}
	var history string
	if err := pool.QueryRow(ctx, `SELECT history::text FROM relay_jobs WHERE kind = $1`, outbox.WebhookKind).Scan(&history); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(history, "500 Internal Server Error") || !strings.Contains(history, "receiver down for maintenance") {
		t.Errorf("history lacks the status and body excerpt: %s", history)
	}
}

func TestWebhookSignature(t *testing.T) {
	t.Parallel()
	var req *http.Request
	var reqBody []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req = r
		reqBody, _ = io.ReadAll(r.Body)
	}))
	defer srv.Close()
	now := time.Unix(1_800_000_000, 0)
	w, err := outbox.NewWebhookWorker(outbox.Endpoint{Name: "e", URL: srv.URL, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	w.Now = func() time.Time { return now }
	job := &core.Job[outbox.WebhookArgs]{JobRow: &core.JobRow{ID: 1}, Args: outbox.WebhookArgs{Endpoint: "e",
		Delivery: outbox.Delivery{EventID: 7, Topic: "t", Payload: json.RawMessage(`{"a":1}`)}}}
	if err := w.Work(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	ts, sig := req.Header.Get(outbox.HeaderTimestamp), req.Header.Get(outbox.HeaderSignature)
	if ts != strconv.FormatInt(now.Unix(), 10) || req.Header.Get(outbox.HeaderEventID) != "7" {
		t.Fatalf("headers %v", req.Header)
	}
	if err := outbox.Verify(secret, ts, sig, reqBody, time.Minute, now.Add(30*time.Second)); err != nil {
		t.Errorf("genuine delivery: %v", err)
	}
	tampered := append([]byte{}, reqBody...)
	tampered[len(tampered)-2] = 'X'
	for name, err := range map[string]error{
		"tampered body": outbox.Verify(secret, ts, sig, tampered, time.Minute, now),
		"wrong secret":  outbox.Verify([]byte("another secret, 16+ bytes"), ts, sig, reqBody, time.Minute, now),
		"replayed late": outbox.Verify(secret, ts, sig, reqBody, time.Minute, now.Add(10*time.Minute)),
		"no signature":  outbox.Verify(secret, ts, "", reqBody, time.Minute, now),
	} {
		if err == nil {
			t.Errorf("%s: verified", name)
		}
	}
	if !errors.Is(outbox.Verify(secret, ts, sig, reqBody, time.Minute, now.Add(time.Hour)), outbox.ErrStale) {
		t.Error("a stale delivery is not ErrStale")
	}
	// An endpoint missing from the worker's configuration is a permanent
	// failure, not a retry loop.
	job.Args.Endpoint = "unknown"
	if err := w.Work(context.Background(), job); err == nil || !strings.Contains(err.Error(), "not configured") {
		t.Errorf("unknown endpoint: %v", err)
	}
	if _, err := outbox.NewWebhookWorker(outbox.Endpoint{Name: "short", URL: srv.URL, Secret: []byte("short")}); err == nil {
		t.Error("a short secret was accepted")
	}
}
