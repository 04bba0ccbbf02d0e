package outbox

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/relayq/relay/core"
)

// WebhookKind is the job kind of webhook deliveries.
const WebhookKind = "relay.webhook"

// The headers of a webhook delivery.
const (
	HeaderEventID   = "Relay-Event-Id"
	HeaderTopic     = "Relay-Topic"
	HeaderTimestamp = "Relay-Timestamp"
	// HeaderSignature is "v1=" and the hex HMAC-SHA256, keyed by the
	// endpoint's secret, of the timestamp, a dot, and the body.
	HeaderSignature = "Relay-Signature"
)

// Endpoint is a webhook receiver. Subscriptions name it; the secret never
// leaves the worker process (jobs carry only the name).
type Endpoint struct {
	Name   string
	URL    string
	Secret []byte
	// Timeout bounds one delivery attempt. Default 10s.
	Timeout time.Duration
}

// WebhookArgs is a webhook delivery job: the event and the endpoint's name.
type WebhookArgs struct {
	Delivery
	Endpoint string `json:"endpoint"`
}

func (WebhookArgs) Kind() string { return WebhookKind }

// webhookBody is what the receiver gets.
type webhookBody struct {
	ID          int64             `json:"id"`
	Topic       string            `json:"topic"`
	Key         string            `json:"key,omitempty"`
	Payload     json.RawMessage   `json:"payload"`
	Headers     map[string]string `json:"headers,omitempty"`
	PublishedAt time.Time         `json:"published_at"`
}

// WebhookWorker delivers WebhookArgs jobs: a signed POST per attempt, with
// the core's retries and backoff, dead when the attempts run out. A non-2xx
// answer fails the attempt with the status and the start of the body, which
// the job's history keeps. Register it with core.AddWorker.
type WebhookWorker struct {
	Endpoints map[string]Endpoint
	// Client sends the requests. Default: http.Client with the endpoint's
	// timeout.
	Client *http.Client
	// Now is the clock for signatures. Default time.Now.
	Now func() time.Time
}

// NewWebhookWorker returns a worker for the given endpoints.
func NewWebhookWorker(endpoints ...Endpoint) (*WebhookWorker, error) {
	w := &WebhookWorker{Endpoints: map[string]Endpoint{}}
	for _, e := range endpoints {
		if e.Name == "" || e.URL == "" || len(e.Secret) < 16 {
			return nil, fmt.Errorf("outbox: endpoint %q: Name, URL and a Secret of at least 16 bytes are required", e.Name)
		}
		if !strings.HasPrefix(e.URL, "http://") && !strings.HasPrefix(e.URL, "https://") {
			return nil, fmt.Errorf("outbox: endpoint %q: URL %q is not http(s)", e.Name, e.URL)
		}
		w.Endpoints[e.Name] = e
	}
	return w, nil
}

// Work delivers one attempt.
func (w *WebhookWorker) Work(ctx context.Context, job *core.Job[WebhookArgs]) error {
	ep, ok := w.Endpoints[job.Args.Endpoint]
	if !ok {
		return core.Permanent(fmt.Errorf("outbox: webhook endpoint %q is not configured in this process", job.Args.Endpoint))
	}
	d := job.Args.Delivery
	body, err := json.Marshal(webhookBody{ID: d.EventID, Topic: d.Topic, Key: d.Key, Payload: d.Payload, Headers: d.Headers, PublishedAt: d.PublishedAt})
	if err != nil {
		return core.Permanent(fmt.Errorf("outbox: encode webhook body: %w", err))
	}
	timeout := ep.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL, bytes.NewReader(body))
	if err != nil {
		return core.Permanent(fmt.Errorf("outbox: webhook %s: %w", ep.Name, err))
	}
	now := time.Now
	if w.Now != nil {
		now = w.Now
	}
	ts := strconv.FormatInt(now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "relay-webhook")
	req.Header.Set(HeaderEventID, strconv.FormatInt(d.EventID, 10))
	req.Header.Set(HeaderTopic, d.Topic)
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, "v1="+sign(ep.Secret, ts, body))
	// Receivers can drop repeats (at-least-once) on this.
	req.Header.Set("Idempotency-Key", fmt.Sprintf("relay-event-%d-%s", d.EventID, ep.Name))
	client := w.Client
	if client == nil {
		client = &http.Client{Timeout: timeout}
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("webhook %s: POST %s: %w", ep.Name, ep.URL, err)
	}
	defer resp.Body.Close()
	excerpt, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("webhook %s: POST %s: %s: %q", ep.Name, ep.URL, resp.Status, excerpt)
	}
	return nil
}

func sign(secret []byte, ts string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// Signature errors.
var (
	ErrBadSignature = errors.New("outbox: webhook signature does not match")
	ErrStale        = errors.New("outbox: webhook timestamp outside the tolerance (a replay?)")
)

// Verify checks a webhook delivery as a receiver should: the signature over
// timestamp and body, with the shared secret, in constant time; and the
// timestamp within tolerance of now, so a captured request cannot be
// replayed later.
func Verify(secret []byte, timestamp, signature string, body []byte, tolerance time.Duration, now time.Time) error {
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: bad timestamp %q", ErrBadSignature, timestamp)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return ErrStale
	}
	got, ok := strings.CutPrefix(signature, "v1=")
	if !ok {
		return fmt.Errorf("%w: no v1 signature", ErrBadSignature)
	}
	want := sign(secret, timestamp, body)
	if !hmac.Equal([]byte(got), []byte(want)) {
		return ErrBadSignature
	}
	return nil
}

// VerifyRequest reads r's body and verifies it (Verify, tolerance 5
// minutes), returning the body.
func VerifyRequest(r *http.Request, secret []byte) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 10<<20))
	if err != nil {
		return nil, err
	}
	if err := Verify(secret, r.Header.Get(HeaderTimestamp), r.Header.Get(HeaderSignature), body, 5*time.Minute, time.Now()); err != nil {
		return nil, err
	}
	return body, nil
}
