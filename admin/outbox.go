package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
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
	State        string          `json:"state" enum:"pending,dispatched"`
	Jobs         int             `json:"jobs" doc:"Jobs the dispatch made (one per subscription)"`
}

type listOutboxInput struct {
	State  string `query:"state" enum:"pending,dispatched"`
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

// OutboxSubscription is a subscription declared in code.
type OutboxSubscription struct {
	Topic    string `json:"topic"`
	Kind     string `json:"kind"`
	Endpoint string `json:"endpoint,omitempty" doc:"Set for a webhook subscription"`
	Queue    string `json:"queue,omitempty"`
}

type subscriptionsOutput struct {
	Body struct {
		Items []OutboxSubscription `json:"items" doc:"The subscriptions the serving process was configured with (they live in code)"`
	}
}

// BlockedKey is an ordering key held up by a dead job at its head.
type BlockedKey struct {
	Queue   string `json:"queue"`
	Key     string `json:"key"`
	Waiting int64  `json:"waiting" doc:"Later jobs of the key, waiting"`
	Head    Job    `json:"head" doc:"The dead job: requeue or cancel it to unblock the key"`
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
			rows, err := s.pool.Query(ctx, sqlListOutbox, in.State, in.Topic, in.Key, idBelow(c), in.Limit+1)
			if err != nil {
				return nil, s.internalError("list outbox events", err)
			}
			items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxEvent, error) {
				var e OutboxEvent
				var payload, headers string
				err := r.Scan(&e.ID, &e.Topic, &e.Key, &payload, &headers, &e.PublishedAt, &e.DispatchedAt, &e.Jobs)
				e.Payload, e.Headers = json.RawMessage(payload), json.RawMessage(headers)
				e.State = "pending"
				if e.DispatchedAt != nil {
					e.State = "dispatched"
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
			out := &subscriptionsOutput{}
			out.Body.Items = []OutboxSubscription{}
			for _, sub := range s.cfg.Subscriptions {
				o := OutboxSubscription{Topic: sub.Topic, Kind: sub.Kind, Endpoint: sub.Endpoint}
				if sub.Opts != nil {
					o.Queue = sub.Opts.Queue
				}
				out.Body.Items = append(out.Body.Items, o)
			}
			return out, nil
		})
	huma.Register(api, op("list-blocked-keys", http.MethodGet, "/v1/outbox/blocked-keys", "List ordering keys blocked by a dead head job", "outbox"),
		func(ctx context.Context, in *blockedKeysInput) (*blockedKeysOutput, error) {
			keys, err := core.BlockedKeys(ctx, s.pool, in.Queue, in.Limit)
			if err != nil {
				return nil, s.internalError("list blocked keys", err)
			}
			out := &blockedKeysOutput{}
			out.Body.Items = []BlockedKey{}
			for _, k := range keys {
				bk := BlockedKey{Queue: k.Queue, Key: k.Key, Waiting: k.Waiting, Head: Job{ID: k.JobID}}
				if row, err := core.JobGet(ctx, s.pool, k.JobID); err == nil {
					bk.Head = Job{ID: row.ID, Kind: row.Kind, Queue: row.Queue, State: string(row.State), Priority: row.Priority,
						Attempt: row.Attempt, MaxAttempts: row.MaxAttempts, RunAt: row.RunAt, CreatedAt: row.CreatedAt,
						AttemptedAt: timePtr(row.AttemptedAt), AttemptedBy: row.AttemptedBy, FinalizedAt: row.FinalizedAt,
						LastError: row.LastError, OrderingKey: row.OrderingKey}
				} else if !errors.Is(err, core.ErrNotFound) {
					return nil, s.internalError("list blocked keys", err)
				}
				out.Body.Items = append(out.Body.Items, bk)
			}
			return out, nil
		})
	re := op("redispatch-outbox-event", http.MethodPost, "/v1/outbox/events/{id}/redispatch", "Dispatch an event again", "outbox")
	re.Description = "Marks a dispatched event pending: the dispatcher turns it into jobs again, one per subscription, " +
		"so subscribers see it once more (they are idempotent by the event id)."
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
		var se huma.StatusError
		if errors.As(err, &se) {
			return nil, se
		}
		if err != nil {
			return nil, s.internalError("redispatch", err)
		}
		return &redispatchOutput{Body: Redispatch{ID: in.ID, State: "pending"}}, nil
	})
}
