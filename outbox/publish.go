package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
)

// Event is what business code publishes.
type Event struct {
	// Topic names what happened ("payment.succeeded"); subscriptions match
	// it exactly.
	Topic string
	// Key orders events: those with the same key reach each subscriber in
	// publish order, one at a time. Empty: no order.
	Key string
	// Payload is the event's body, encoded as JSON.
	Payload any
	// Headers travel with the event (trace context, tenant, ...).
	Headers map[string]string
}

// Publish writes e through db — in the caller's transaction (pgx.Tx,
// bun.Tx, *sql.Tx) when given one, so the event exists only if the
// transaction commits. It returns the event's id. Publishers of one key wait
// for each other's transactions (that is what keeps a key's order).
//
// When ctx carries a span, its W3C trace context is stored with the event:
// the dispatcher parents each of the event's jobs under it (see
// Config.TracerProvider), so one request's trace shows its event's jobs.
func Publish(ctx context.Context, db core.DB, e Event) (int64, error) {
	if e.Topic == "" || len(e.Topic) > 200 {
		return 0, errors.New("outbox: publish: topic must be 1 to 200 bytes")
	}
	if len(e.Key) > 500 {
		return 0, errors.New("outbox: publish: key longer than 500 bytes")
	}
	payload, err := json.Marshal(e.Payload)
	if err != nil {
		return 0, fmt.Errorf("outbox: publish %s: encode payload: %w", e.Topic, err)
	}
	headers := []byte("{}")
	if len(e.Headers) > 0 {
		if headers, err = json.Marshal(e.Headers); err != nil {
			return 0, fmt.Errorf("outbox: publish %s: encode headers: %w", e.Topic, err)
		}
	}
	tc := ""
	if trace.SpanContextFromContext(ctx).IsValid() {
		carrier := propagation.MapCarrier{}
		traceContext.Inject(ctx, carrier)
		b, err := json.Marshal(carrier)
		if err != nil {
			return 0, fmt.Errorf("outbox: publish %s: encode trace context: %w", e.Topic, err)
		}
		tc = string(b)
	}
	ex, err := dbx.For(db)
	if err != nil {
		return 0, fmt.Errorf("outbox: publish: %w", err)
	}
	var id int64
	err = ex.Query(ctx, sqlPublish, []any{e.Topic, e.Key, string(payload), string(headers), tc}, func(r dbx.Scanner) error {
		return r.Scan(&id)
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: publish %s: %w", e.Topic, err)
	}
	return id, nil
}

// Delivery is an event as a subscriber's job receives it. Embed it in the
// job's args type:
//
//	type SendReceipt struct{ outbox.Delivery }
//	func (SendReceipt) Kind() string { return "receipt.send" }
type Delivery struct {
	EventID     int64             `json:"event_id"`
	Topic       string            `json:"topic"`
	Key         string            `json:"key,omitempty"`
	Payload     json.RawMessage   `json:"payload"`
	Headers     map[string]string `json:"headers,omitempty"`
	PublishedAt time.Time         `json:"published_at"`
}

// Decode unmarshals the payload into v.
func (d Delivery) Decode(v any) error {
	if err := json.Unmarshal(d.Payload, v); err != nil {
		return fmt.Errorf("outbox: event %d (%s): decode payload into %T: %w", d.EventID, d.Topic, v, err)
	}
	return nil
}
