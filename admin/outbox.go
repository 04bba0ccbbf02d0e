package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/outbox"
)

// OutboxEvent is a published event.
type OutboxEvent struct {
	ID           int64           `json:"id"`
	Topic        string          `json:"topic"`
	Key          string          `json:"key,omitempty"`
	Payload      json.RawMessage `json:"payload"`
	Headers      json.RawMessage `json:"headers"`
	PublishedAt  time.Time       `json:"published_at"`
	DispatchedAt *time.Time      `json:"dispatched_at,omitempty"`
	State        string          `json:"state" enum:"pending,dispatched,failed"`
	Jobs         int             `json:"jobs" doc:"Jobs the dispatch made (one per subscription)"`
	// DispatchError is what of the stored event the dispatcher could not
	// decode: with state failed it was set aside with no jobs (redispatch
	// it once the row is fixed); with state dispatched it went without
	// that part (a trace context: it started a new trace).
	DispatchError string     `json:"dispatch_error,omitempty" doc:"A stored value the dispatcher could not decode"`
	FailedAt      *time.Time `json:"failed_at,omitempty" doc:"Set aside by the dispatcher: a stored value did not decode"`
}

type listOutboxInput struct {
	State  string `query:"state" enum:"pending,dispatched,failed"`
	Topic  string `query:"topic" maxLength:"200"`
	Key    string `query:"key" maxLength:"500"`
	Limit  int    `query:"limit" minimum:"1" maximum:"500" default:"50"`
	Cursor string `query:"cursor" maxLength:"200"`
}

type listOutboxOutput struct {
	Body struct {
		Items      []OutboxEvent `json:"items"`
		NextCursor string        `json:"next_cursor,omitempty"`
	}
}

// OutboxSubscription is a subscription as the dispatchers stored it.
type OutboxSubscription struct {
	Topic       string `json:"topic"`
	Kind        string `json:"kind"`
	Endpoint    string `json:"endpoint,omitempty" doc:"Set for a webhook subscription"`
	Queue       string `json:"queue,omitempty"`
	Namespace   string `json:"namespace" doc:"The service whose dispatchers declare it"`
	Priority    *int   `json:"priority,omitempty" doc:"absent: the job kind's default"`
	MaxAttempts int    `json:"max_attempts" doc:"0: the kind's default"`
	// Retired is true when no live dispatcher of its namespace declares it
	// any more: it gets no more jobs.
	Retired   bool       `json:"retired"`
	RetiredAt *time.Time `json:"retired_at,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	Error     string     `json:"error,omitempty" doc:"A stored value the dispatchers cannot use: metadata that is not an object (its jobs go without it) or options the core refuses (it gets no jobs)"`
}

type subscriptionsOutput struct {
	Body struct {
		Items []OutboxSubscription `json:"items" doc:"Every stored subscription, by topic: declared by the dispatchers of any process (no paging: they are few)"`
	}
}

// BlockedKey is an ordering key held up by a dead job at its head.
type BlockedKey struct {
	Queue string `json:"queue"`
	Key   string `json:"key" doc:"The core ordering key, as stored"`
	// EventKey and Subscriber say what an ordering key the outbox made
	// stands for: the events' key, and the subscription whose jobs it
	// orders (its job kind, or its webhook endpoint). The stored key is
	// the outbox's internal form, kind|endpoint|key.
	EventKey   string `json:"event_key,omitempty" doc:"For a key the outbox made: the events' key"`
	Subscriber string `json:"subscriber,omitempty" doc:"For a key the outbox made: the subscription's job kind, or its webhook endpoint"`
	Waiting    int64  `json:"waiting" doc:"Later jobs of the key, waiting"`
	Head       Job    `json:"head" doc:"The dead job: requeue or cancel it to unblock the key"`
}

type blockedKeysInput struct {
	Queue string `query:"queue" maxLength:"128"`
	Limit int    `query:"limit" minimum:"1" maximum:"500" default:"50"`
}

type blockedKeysOutput struct {
	Body struct {
		Items []BlockedKey `json:"items" doc:"Oldest first"`
	}
}

type outboxIDInput struct {
	ID int64 `path:"id" minimum:"1"`
}

// Redispatch says what a redispatch did.
type Redispatch struct {
	ID    int64  `json:"id"`
	State string `json:"state" enum:"pending"`
}

type redispatchOutput struct {
	Body Redispatch
}

func (s *server) registerOutbox(api huma.API) {
	huma.Register(api, op("list-outbox-events", http.MethodGet, "/v1/outbox/events", "List outbox events, newest first", "outbox"),
		func(ctx context.Context, in *listOutboxInput) (*listOutboxOutput, error) {
			c, err := decodeCursor(in.Cursor, "outbox")
			if err != nil {
				return nil, err
			}
			rows, err := s.read.Query(ctx, sqlListOutbox, in.State, in.Topic, in.Key, idBelow(c), in.Limit+1)
			if err != nil {
				return nil, s.internalError("list outbox events", err)
			}
			items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxEvent, error) {
				var e OutboxEvent
				var payload, headers string
				// An infinite published_at (written behind Publish; the
				// dispatcher sets such an event aside) lists as the zero
				// time rather than failing the whole page.
				var published pgtype.Timestamptz
				err := r.Scan(&e.ID, &e.Topic, &e.Key, &payload, &headers, &published, &e.DispatchedAt, &e.Jobs,
					&e.FailedAt, &e.DispatchError)
				e.Payload, e.Headers, e.PublishedAt = json.RawMessage(payload), json.RawMessage(headers), published.Time
				switch {
				case e.FailedAt != nil:
					e.State = "failed"
				case e.DispatchedAt != nil:
					e.State = "dispatched"
				default:
					e.State = "pending"
				}
				return e, err
			})
			if err != nil {
				return nil, s.internalError("list outbox events", err)
			}
			out := &listOutboxOutput{}
			out.Body.Items = items
			if len(items) > in.Limit {
				out.Body.Items = items[:in.Limit]
				out.Body.NextCursor = cursor{Kind: "outbox", ID: items[in.Limit-1].ID}.encode()
			}
			return out, nil
		})
	huma.Register(api, op("list-outbox-subscriptions", http.MethodGet, "/v1/outbox/subscriptions", "List outbox subscriptions", "outbox"),
		func(ctx context.Context, _ *struct{}) (*subscriptionsOutput, error) {
			subs, err := outbox.ListSubscriptions(ctx, s.read)
			if err != nil {
				return nil, s.internalError("list outbox subscriptions", err)
			}
			out := &subscriptionsOutput{}
			out.Body.Items = []OutboxSubscription{}
			for _, sub := range subs {
				out.Body.Items = append(out.Body.Items, OutboxSubscription{Topic: sub.Topic, Kind: sub.Kind, Endpoint: sub.Endpoint,
					Queue: sub.Queue, Namespace: sub.Namespace, Priority: sub.Priority, MaxAttempts: sub.MaxAttempts,
					Retired: sub.RetiredAt != nil, RetiredAt: sub.RetiredAt, CreatedAt: sub.CreatedAt, Error: sub.Error})
			}
			return out, nil
		})
	huma.Register(api, op("list-blocked-keys", http.MethodGet, "/v1/outbox/blocked-keys", "List ordering keys blocked by a dead head job", "outbox"),
		func(ctx context.Context, in *blockedKeysInput) (*blockedKeysOutput, error) {
			keys, err := core.BlockedKeys(ctx, s.read, in.Queue, in.Limit)
			if err != nil {
				return nil, s.internalError("list blocked keys", err)
			}
			out := &blockedKeysOutput{}
			out.Body.Items = []BlockedKey{}
			for _, k := range keys {
				bk := BlockedKey{Queue: k.Queue, Key: k.Key, Waiting: k.Waiting, Head: Job{ID: k.JobID}}
				if row, err := core.JobGet(ctx, s.read, k.JobID); err == nil {
					bk.Head = jobFromRow(row)
					bk.EventKey, bk.Subscriber = outboxKey(k.Key, row)
				} else if !errors.Is(err, core.ErrNotFound) {
					return nil, s.internalError("list blocked keys", err)
				}
				out.Body.Items = append(out.Body.Items, bk)
			}
			return out, nil
		})
	re := op("redispatch-outbox-event", http.MethodPost, "/v1/outbox/events/{id}/redispatch", "Dispatch an event again", "outbox")
	re.Description = "Marks a dispatched or failed event pending: the dispatcher turns it into jobs again, one per subscription, " +
		"so subscribers see it once more (they are idempotent by the event id). A failed event is read again as stored: fix the row first."
	huma.Register(api, re, func(ctx context.Context, in *outboxIDInput) (*redispatchOutput, error) {
		_, err := s.change(ctx, "outbox.redispatch", map[string]any{"ids": []int64{in.ID}}, func(tx pgx.Tx) (int64, error) {
			tag, err := tx.Exec(ctx, sqlRedispatch, in.ID)
			if err != nil {
				return 0, err
			}
			if tag.RowsAffected() == 0 {
				var pending bool
				if err := tx.QueryRow(ctx, sqlOutboxExists, in.ID).Scan(&pending); errors.Is(err, pgx.ErrNoRows) {
					return 0, huma.Error404NotFound(fmt.Sprintf("outbox event %d not found", in.ID))
				} else if err != nil {
					return 0, err
				}
				return 0, huma.Error409Conflict(fmt.Sprintf("outbox event %d is not dispatched yet", in.ID))
			}
			_, err = tx.Exec(ctx, sqlNotifyOutbox)
			return 1, err
		})
		if err != nil {
			return nil, s.internalError("redispatch", err)
		}
		return &redispatchOutput{Body: Redispatch{ID: in.ID, State: "pending"}}, nil
	})
}

// outboxKey splits an ordering key the outbox dispatcher made for head's
// job (kind|endpoint|event key, endpoint empty for a job subscription)
// into the event key and the subscriber; "", "" for any other key.
func outboxKey(key string, head *core.JobRow) (eventKey, subscriber string) {
	rest, ok := strings.CutPrefix(key, head.Kind+"|")
	if !ok {
		return "", ""
	}
	var args struct {
		Endpoint string `json:"endpoint"`
	}
	_ = json.Unmarshal(head.EncodedArgs, &args) // no endpoint: a job subscription
	eventKey, ok = strings.CutPrefix(rest, args.Endpoint+"|")
	if !ok || eventKey == "" {
		return "", ""
	}
	return eventKey, cmp.Or(args.Endpoint, head.Kind)
}
