package outbox

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
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/relayq/relay/core"
)

// WebhookKind is the job kind of webhook deliveries.
const WebhookKind = "relay.webhook"

// The headers of a webhook delivery. Signatures follow the Standard
// Webhooks specification (https://www.standardwebhooks.com): receivers can
// verify them with its libraries in many languages, or with Verify in Go.
const (
	// HeaderWebhookID identifies the message: the same for every attempt at
	// one event for one endpoint ("relay-event-<id>-<endpoint>"), so a
	// receiver can drop repeats on it. Idempotency-Key carries it too.
	HeaderWebhookID = "webhook-id"
	// HeaderTimestamp is the attempt's time, in Unix seconds.
	HeaderTimestamp = "webhook-timestamp"
	// HeaderSignature is one or more space-separated "v1,<base64 HMAC-SHA256
	// of id.timestamp.body>", one per secret the endpoint signs with.
	HeaderSignature = "webhook-signature"
	// HeaderEventID and HeaderTopic are Relay's own, for routing.
	HeaderEventID = "Relay-Event-Id"
	HeaderTopic   = "Relay-Topic"
)

// secretPrefix marks a Standard Webhooks secret: "whsec_" and the key in
// base64.
const secretPrefix = "whsec_"

// FormatSecret renders a signing key as the "whsec_<base64>" string that
// Standard Webhooks libraries take.
func FormatSecret(key []byte) string {
	return secretPrefix + base64.StdEncoding.EncodeToString(key)
}

// MinSecretLen and MaxSecretLen bound a signing key's length in bytes, as
// the Standard Webhooks specification asks (24 to 64).
const (
	MinSecretLen = 24
	MaxSecretLen = 64
)

// ParseSecret reads a "whsec_<base64>" secret (the prefix is optional) into
// the signing key for Endpoint.Secret. A key outside MinSecretLen to
// MaxSecretLen bytes is an error.
func ParseSecret(s string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, secretPrefix))
	if err != nil {
		return nil, fmt.Errorf("outbox: webhook secret is not whsec_<base64>: %w", err)
	}
	if err := checkSecret(key); err != nil {
		return nil, fmt.Errorf("outbox: webhook secret: %w", err)
	}
	return key, nil
}

// checkSecret refuses a signing key outside the specification's lengths.
func checkSecret(key []byte) error {
	if len(key) < MinSecretLen || len(key) > MaxSecretLen {
		return fmt.Errorf("a signing key must be %d to %d bytes, not %d", MinSecretLen, MaxSecretLen, len(key))
	}
	return nil
}

// Endpoint is a webhook receiver. Subscriptions name it; the secret never
// leaves the worker process (jobs carry only the name).
type Endpoint struct {
	Name string
	URL  string
	// Secret is the signing key (MinSecretLen to MaxSecretLen bytes, 24 to
	// 64, as Standard Webhooks asks): give the receiver
	// FormatSecret(Secret). ParseSecret reads a whsec_ secret.
	Secret []byte
	// PreviousSecrets are also signed with, for key rotation: while they
	// are listed every delivery carries one signature per secret, so a
	// receiver verifying with either the new or an old secret accepts it.
	PreviousSecrets [][]byte
	// Timeout bounds one delivery attempt. Default 10s.
	Timeout time.Duration
}

// WebhookArgs is a webhook delivery job: the event and the endpoint's name.
type WebhookArgs struct {
	Delivery
	Endpoint string `json:"endpoint"`
}

func (WebhookArgs) Kind() string { return WebhookKind }

// traceContext is the W3C format the webhook requests carry.
var traceContext = propagation.TraceContext{}

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
// the job's history keeps. Redirects are not followed: a 3xx fails the
// attempt with its status and Location (re-sending a signed event to
// another URL is the receiver's configuration to fix, not the sender's to
// guess). Register it with core.AddWorker.
type WebhookWorker struct {
	Endpoints map[string]Endpoint
	// Client sends the requests (its redirect policy is replaced: redirects
	// are never followed). Default: http.Client with the endpoint's
	// timeout.
	Client *http.Client
	// Now is the clock for signatures. Default time.Now.
	Now func() time.Time
}

// NewWebhookWorker returns a worker for the given endpoints.
func NewWebhookWorker(endpoints ...Endpoint) (*WebhookWorker, error) {
	w := &WebhookWorker{Endpoints: map[string]Endpoint{}}
	for _, e := range endpoints {
		if e.Name == "" || e.URL == "" || len(e.Secret) == 0 {
			return nil, fmt.Errorf("outbox: endpoint %q: Name, URL and Secret are required", e.Name)
		}
		if err := checkSecret(e.Secret); err != nil {
			return nil, fmt.Errorf("outbox: endpoint %q: Secret: %w", e.Name, err)
		}
		for i, old := range e.PreviousSecrets {
			if err := checkSecret(old); err != nil {
				return nil, fmt.Errorf("outbox: endpoint %q: PreviousSecrets[%d]: %w", e.Name, i, err)
			}
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
		// Not permanent: during a rolling deploy a subscription to an
		// endpoint that only the new version configures is stored, and
		// fanned out to, before every worker knows the endpoint. The retry
		// (with the core's backoff) lets a worker that does deliver it.
		return fmt.Errorf("outbox: webhook endpoint %q is not configured in this process (retried: a worker of a newer version may know it)", job.Args.Endpoint)
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
	msgID := fmt.Sprintf("relay-event-%d-%s", d.EventID, ep.Name)
	sigs := make([]string, 0, 1+len(ep.PreviousSecrets))
	for _, key := range append([][]byte{ep.Secret}, ep.PreviousSecrets...) {
		sigs = append(sigs, "v1,"+sign(key, msgID, ts, body))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "relay-webhook")
	req.Header.Set(HeaderWebhookID, msgID)
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, strings.Join(sigs, " "))
	req.Header.Set(HeaderEventID, strconv.FormatInt(d.EventID, 10))
	req.Header.Set(HeaderTopic, d.Topic)
	// Receivers can drop repeats (at-least-once) on this.
	req.Header.Set("Idempotency-Key", msgID)
	// The attempt's trace continues in the receiver.
	traceContext.Inject(ctx, propagation.HeaderCarrier(req.Header))
	client := &http.Client{Timeout: timeout}
	if w.Client != nil {
		c := *w.Client
		client = &c
	}
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("webhook %s: POST %s: %w", ep.Name, ep.URL, err)
	}
	defer resp.Body.Close()
	excerpt, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode >= 300 && resp.StatusCode <= 399 {
		loc := resp.Header.Get("Location")
		if len(loc) > 512 { // the receiver's text goes into the job's history
			loc = loc[:512] + "…"
		}
		return fmt.Errorf("webhook %s: POST %s: %s, Location %q: redirects are not followed; configure the endpoint's final URL",
			ep.Name, ep.URL, resp.Status, loc)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("webhook %s: POST %s: %s: %q", ep.Name, ep.URL, resp.Status, excerpt)
	}
	return nil
}

// sign is the Standard Webhooks v1 signature: base64 of the HMAC-SHA256,
// keyed by the secret, of "id.timestamp.body".
func sign(key []byte, msgID, ts string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msgID))
	m.Write([]byte("."))
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// Signature errors.
var (
	ErrBadSignature = errors.New("outbox: webhook signature does not match")
	ErrStale        = errors.New("outbox: webhook timestamp outside the tolerance (a replay?)")
)

// Verify checks a webhook delivery as a receiver should, per Standard
// Webhooks: one of the space-separated v1 signatures must be the HMAC of
// "id.timestamp.body" with the shared secret (compared in constant time),
// and the timestamp must be within tolerance of now, so a captured request
// cannot be replayed later.
func Verify(secret []byte, msgID, timestamp, signatures string, body []byte, tolerance time.Duration, now time.Time) error {
	if msgID == "" {
		return fmt.Errorf("%w: no %s", ErrBadSignature, HeaderWebhookID)
	}
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: bad timestamp %q", ErrBadSignature, timestamp)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return ErrStale
	}
	want := []byte(sign(secret, msgID, timestamp, body))
	found := false
	for _, s := range strings.Fields(signatures) {
		got, ok := strings.CutPrefix(s, "v1,")
		if !ok {
			continue // another scheme or version
		}
		found = true
		if hmac.Equal([]byte(got), want) {
			return nil
		}
	}
	if !found {
		return fmt.Errorf("%w: no v1 signature", ErrBadSignature)
	}
	return ErrBadSignature
}

// VerifyRequest reads r's body and verifies it (Verify, tolerance 5
// minutes), returning the body.
func VerifyRequest(r *http.Request, secret []byte) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 10<<20))
	if err != nil {
		return nil, err
	}
	if err := Verify(secret, r.Header.Get(HeaderWebhookID), r.Header.Get(HeaderTimestamp), r.Header.Get(HeaderSignature),
		body, 5*time.Minute, time.Now()); err != nil {
		return nil, err
	}
	return body, nil
}
