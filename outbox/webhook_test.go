package outbox_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/testkit/testdb"
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
	id, ts, sig := req.Header.Get(outbox.HeaderWebhookID), req.Header.Get(outbox.HeaderTimestamp), req.Header.Get(outbox.HeaderSignature)
	if ts != strconv.FormatInt(now.Unix(), 10) || req.Header.Get(outbox.HeaderEventID) != "7" || id != "relay-event-7-e" {
		t.Fatalf("headers %v", req.Header)
	}
	if err := outbox.Verify(secret, id, ts, sig, reqBody, time.Minute, now.Add(30*time.Second)); err != nil {
		t.Errorf("genuine delivery: %v", err)
	}
	tampered := append([]byte{}, reqBody...)
	tampered[len(tampered)-2] = 'X'
	for name, err := range map[string]error{
		"tampered body": outbox.Verify(secret, id, ts, sig, tampered, time.Minute, now),
		"other id":      outbox.Verify(secret, "relay-event-8-e", ts, sig, reqBody, time.Minute, now),
		"wrong secret":  outbox.Verify([]byte("another secret, 16+ bytes"), id, ts, sig, reqBody, time.Minute, now),
		"replayed late": outbox.Verify(secret, id, ts, sig, reqBody, time.Minute, now.Add(10*time.Minute)),
		"no signature":  outbox.Verify(secret, id, ts, "", reqBody, time.Minute, now),
	} {
		if err == nil {
			t.Errorf("%s: verified", name)
		}
	}
	if !errors.Is(outbox.Verify(secret, id, ts, sig, reqBody, time.Minute, now.Add(time.Hour)), outbox.ErrStale) {
		t.Error("a stale delivery is not ErrStale")
	}
	// An endpoint missing from the worker's configuration fails the attempt
	// but not the job: in a rolling deploy a newer worker may know it.
	job.Args.Endpoint = "unknown"
	if err := w.Work(context.Background(), job); err == nil || !strings.Contains(err.Error(), "not configured") ||
		strings.HasPrefix(err.Error(), "permanent") {
		t.Errorf("unknown endpoint: %v; want a retryable failure", err)
	}
	// Standard Webhooks asks for keys of 24 to 64 bytes.
	for _, n := range []int{16, 23, 65} {
		key := bytes.Repeat([]byte("k"), n)
		if _, err := outbox.NewWebhookWorker(outbox.Endpoint{Name: "e", URL: srv.URL, Secret: key}); err == nil || !strings.Contains(err.Error(), "24 to 64 bytes") {
			t.Errorf("a %d-byte secret: %v; want refused", n, err)
		}
		if _, err := outbox.NewWebhookWorker(outbox.Endpoint{Name: "e", URL: srv.URL, Secret: secret, PreviousSecrets: [][]byte{key}}); err == nil {
			t.Errorf("a %d-byte previous secret was accepted", n)
		}
		if _, err := outbox.ParseSecret(outbox.FormatSecret(key)); err == nil {
			t.Errorf("ParseSecret accepted a %d-byte key", n)
		}
	}
	for _, n := range []int{24, 64} {
		if _, err := outbox.NewWebhookWorker(outbox.Endpoint{Name: "e", URL: srv.URL, Secret: bytes.Repeat([]byte("k"), n)}); err != nil {
			t.Errorf("a %d-byte secret: %v; want accepted", n, err)
		}
	}
}

// deliver runs one attempt of event 7 to url and returns the error.
func deliver(t *testing.T, ep outbox.Endpoint) error {
	t.Helper()
	w, err := outbox.NewWebhookWorker(ep)
	if err != nil {
		t.Fatal(err)
	}
	return w.Work(context.Background(), &core.Job[outbox.WebhookArgs]{JobRow: &core.JobRow{ID: 1}, Args: outbox.WebhookArgs{
		Endpoint: ep.Name, Delivery: outbox.Delivery{EventID: 7, Topic: "payment.succeeded", Payload: json.RawMessage(`{"order":"o-7"}`)}}})
}

// specVerify is a receiver written from the Standard Webhooks
// specification alone: the secret is whsec_ and base64; the signed content
// is "id.timestamp.body"; the header holds space-separated "v1,<base64>"
// signatures, any of which may match.
func specVerify(whsec string, h http.Header, body []byte) bool {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(whsec, "whsec_"))
	if err != nil {
		return false
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(h.Get("webhook-id") + "." + h.Get("webhook-timestamp") + "." + string(body)))
	want := base64.StdEncoding.EncodeToString(m.Sum(nil))
	for _, s := range strings.Split(h.Get("webhook-signature"), " ") {
		if v, sig, ok := strings.Cut(s, ","); ok && v == "v1" && hmac.Equal([]byte(sig), []byte(want)) {
			return true
		}
	}
	return false
}

// Deliveries verify with the Standard Webhooks reference Go library and
// with a receiver written from the specification alone — during a key
// rotation too, whichever of the two secrets the receiver holds.
func TestWebhookStandardWebhooksInterop(t *testing.T) {
	t.Parallel()
	oldKey, newKey := []byte("the old secret, 16+ bytes"), []byte("the new secret, 16+ bytes")
	for _, tc := range []struct {
		name     string
		ep       outbox.Endpoint
		receiver []byte // the key the receiver holds
	}{
		{"one secret", outbox.Endpoint{Secret: newKey}, newKey},
		{"rotation, receiver still on the old secret", outbox.Endpoint{Secret: newKey, PreviousSecrets: [][]byte{oldKey}}, oldKey},
		{"rotation, receiver on the new secret", outbox.Endpoint{Secret: newKey, PreviousSecrets: [][]byte{oldKey}}, newKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whsec := outbox.FormatSecret(tc.receiver)
			ref, err := standardwebhooks.NewWebhook(whsec)
			if err != nil {
				t.Fatal(err)
			}
			var refErr, bodyErr error
			var spec, ours bool
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				refErr = ref.Verify(body, r.Header)
				spec = specVerify(whsec, r.Header, body)
				key, err := outbox.ParseSecret(whsec)
				if err != nil {
					bodyErr = err
					return
				}
				r.Body = io.NopCloser(strings.NewReader(string(body)))
				_, bodyErr = outbox.VerifyRequest(r, key)
				ours = bodyErr == nil
			}))
			defer srv.Close()
			tc.ep.Name, tc.ep.URL = "shop", srv.URL
			if err := deliver(t, tc.ep); err != nil {
				t.Fatal(err)
			}
			if refErr != nil {
				t.Errorf("reference library: %v", refErr)
			}
			if !spec {
				t.Error("spec-only receiver refused the delivery")
			}
			if !ours {
				t.Errorf("outbox.VerifyRequest: %v", bodyErr)
			}
		})
	}
	// And a receiver holding a secret the sender does not use refuses.
	ref, _ := standardwebhooks.NewWebhook(outbox.FormatSecret([]byte("a stranger's secret, 16+")))
	var refErr error
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		refErr = ref.Verify(body, r.Header)
	}))
	defer srv.Close()
	if err := deliver(t, outbox.Endpoint{Name: "shop", URL: srv.URL, Secret: newKey}); err != nil {
		t.Fatal(err)
	}
	if refErr == nil {
		t.Error("the reference library verified a delivery signed with another secret")
	}
}

// A 3xx is not followed (it would be re-sent as a body-less GET, and a 200
// there counted as delivered): the attempt fails with the status and the
// Location.
func TestWebhookDoesNotFollowRedirects(t *testing.T) {
	t.Parallel()
	var gets atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/moved" {
			gets.Add(1)
			return
		}
		http.Redirect(w, r, "/moved", http.StatusFound)
	}))
	defer srv.Close()
	for _, client := range []*http.Client{nil, {}} {
		w, err := outbox.NewWebhookWorker(outbox.Endpoint{Name: "shop", URL: srv.URL + "/hooks", Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		w.Client = client
		err = w.Work(context.Background(), &core.Job[outbox.WebhookArgs]{JobRow: &core.JobRow{ID: 1}, Args: outbox.WebhookArgs{
			Endpoint: "shop", Delivery: outbox.Delivery{EventID: 7, Topic: "t", Payload: json.RawMessage(`{}`)}}})
		if err == nil || !strings.Contains(err.Error(), "302 Found") || !strings.Contains(err.Error(), `Location "/moved"`) {
			t.Errorf("client %v: %v; want a failure naming 302 and the Location", client, err)
		}
	}
	if gets.Load() != 0 {
		t.Errorf("the redirect was followed %d times", gets.Load())
	}
}

// A receiver's Location header is cut before it goes into the job's
// history: a 3xx cannot write megabytes into every attempt's error.
func TestWebhookRedirectErrorIsBounded(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/"+strings.Repeat("x", 100_000))
		w.WriteHeader(http.StatusMovedPermanently)
	}))
	defer srv.Close()
	err := deliver(t, outbox.Endpoint{Name: "shop", URL: srv.URL, Secret: secret})
	if err == nil || !strings.Contains(err.Error(), "301") || len(err.Error()) > 2000 {
		t.Errorf("%d-byte error (%.200v); want a 301 failure of at most 2000 bytes", len(fmt.Sprint(err)), err)
	}
}
