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
)

// IdempotencyKey is a stored key.
type IdempotencyKey struct {
	Scope          string          `json:"scope"`
	Key            string          `json:"key"`
	Status         string          `json:"status" enum:"running,succeeded"`
	Result         json.RawMessage `json:"result,omitempty" doc:"The stored result of a succeeded key"`
	LeaseExpiresAt *time.Time      `json:"lease_expires_at,omitempty" doc:"While running: when its holder's lease ends"`
	ExpiresAt      time.Time       `json:"expires_at"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
}

type idemInput struct {
	Scope string `query:"scope" required:"true" minLength:"1" maxLength:"200"`
	Key   string `query:"key" required:"true" minLength:"1" maxLength:"500"`
}

type idemOutput struct {
	Body IdempotencyKey
}

// IdempotencyDelete says what a delete did.
type IdempotencyDelete struct {
	Scope   string `json:"scope"`
	Key     string `json:"key"`
	Deleted bool   `json:"deleted"`
}

type idemDeleteOutput struct {
	Body IdempotencyDelete
}

func (s *server) registerIdempotency(api huma.API) {
	huma.Register(api, op("get-idempotency-key", http.MethodGet, "/v1/idempotency-keys", "Look up an idempotency key by scope and key", "idempotency"),
		func(ctx context.Context, in *idemInput) (*idemOutput, error) {
			k := IdempotencyKey{Scope: in.Scope, Key: in.Key}
			var result *string
			err := s.pool.QueryRow(ctx, sqlGetIdempotencyKey, in.Scope, in.Key).Scan(&k.Status, &result, &k.ExpiresAt, &k.CreatedAt, &k.UpdatedAt, &k.LeaseExpiresAt)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil, huma.Error404NotFound(fmt.Sprintf("no idempotency key %q in scope %q", in.Key, in.Scope))
			}
			if err != nil {
				return nil, s.internalError("get idempotency key", err)
			}
			if result != nil {
				k.Result = json.RawMessage(*result)
			}
			return &idemOutput{Body: k}, nil
		})
	del := op("delete-idempotency-key", http.MethodDelete, "/v1/idempotency-keys", "Delete an idempotency key", "idempotency")
	del.Description = "The next call with this scope and key runs its effect again. Deleting a running key lets a second " +
		"attempt start beside the first: do it only when its holder is gone."
	huma.Register(api, del, func(ctx context.Context, in *idemInput) (*idemDeleteOutput, error) {
		n, err := s.change(ctx, "idempotency.delete", map[string]any{"scope": in.Scope, "key": in.Key}, func(tx pgx.Tx) (int64, error) {
			tag, err := tx.Exec(ctx, sqlDeleteIdempotencyKey, in.Scope, in.Key)
			if err == nil && tag.RowsAffected() == 0 {
				return 0, huma.Error404NotFound(fmt.Sprintf("no idempotency key %q in scope %q", in.Key, in.Scope))
			}
			return tag.RowsAffected(), err
		})
		var se huma.StatusError
		if errors.As(err, &se) {
			return nil, se
		}
		if err != nil {
			return nil, s.internalError("delete idempotency key", err)
		}
		return &idemDeleteOutput{Body: IdempotencyDelete{Scope: in.Scope, Key: in.Key, Deleted: n == 1}}, nil
	})
}
