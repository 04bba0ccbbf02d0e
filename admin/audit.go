package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// change runs fn in a transaction and records it in the audit log in that
// same transaction: the change and its record commit together or not at all.
// fn returns how many rows it changed; target (ids or a filter) is stored as
// JSON. The transaction waits at most Config.LockTimeout for a row another
// transaction holds (lock_timeout, SQLSTATE 55P03; see isLockTimeout).
func (s *server) change(ctx context.Context, action string, target any, fn func(pgx.Tx) (int64, error)) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlSetLockTimeout, strconv.FormatInt(s.cfg.LockTimeout.Milliseconds(), 10)); err != nil {
			return fmt.Errorf("admin: set lock_timeout: %w", err)
		}
		var err error
		if n, err = fn(tx); err != nil {
			return err
		}
		return audit(ctx, tx, subject(ctx), action, target, n)
	})
	return n, err
}

// isLockTimeout reports whether err is a lock wait that ran out of
// Config.LockTimeout.
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

func audit(ctx context.Context, tx pgx.Tx, subject, action string, target any, n int64) error {
	b, err := json.Marshal(target)
	if err != nil {
		return fmt.Errorf("admin: audit: encode target: %w", err)
	}
	if _, err := tx.Exec(ctx, sqlAudit, subject, action, string(b), n); err != nil {
		return fmt.Errorf("admin: audit: %w", err)
	}
	return nil
}

// AuditEntry is one admin write.
type AuditEntry struct {
	ID          int64           `json:"id"`
	At          time.Time       `json:"at"`
	Subject     string          `json:"subject" doc:"The token's sub claim"`
	Action      string          `json:"action" example:"jobs.requeue"`
	Target      json.RawMessage `json:"target" doc:"The ids or the filter the action was given"`
	RowsChanged int64           `json:"rows_changed"`
}

type listAuditInput struct {
	Subject string `query:"subject" maxLength:"500"`
	Action  string `query:"action" maxLength:"100"`
	Limit   int    `query:"limit" minimum:"1" maximum:"500" default:"50"`
	Cursor  string `query:"cursor" maxLength:"200"`
}

type listAuditOutput struct {
	Body struct {
		Items      []AuditEntry `json:"items"`
		NextCursor string       `json:"next_cursor,omitempty" doc:"Pass as cursor for the next page; absent on the last page"`
	}
}

func (s *server) registerAudit(api huma.API) {
	huma.Register(api, op("list-audit", http.MethodGet, "/v1/audit", "List the audit log, newest first", "audit"),
		func(ctx context.Context, in *listAuditInput) (*listAuditOutput, error) {
			c, err := decodeCursor(in.Cursor, "audit")
			if err != nil {
				return nil, err
			}
			out := &listAuditOutput{}
			out.Body.Items = []AuditEntry{}
			rows, err := s.read.Query(ctx, sqlListAudit, in.Subject, in.Action, idBelow(c), in.Limit+1)
			if err != nil {
				return nil, s.internalError("list audit", err)
			}
			defer rows.Close()
			for rows.Next() {
				var e AuditEntry
				var target string
				if err := rows.Scan(&e.ID, &e.At, &e.Subject, &e.Action, &target, &e.RowsChanged); err != nil {
					return nil, s.internalError("list audit", err)
				}
				e.Target = json.RawMessage(target)
				out.Body.Items = append(out.Body.Items, e)
			}
			if err := rows.Err(); err != nil {
				return nil, s.internalError("list audit", err)
			}
			if len(out.Body.Items) > in.Limit {
				out.Body.Items = out.Body.Items[:in.Limit]
				out.Body.NextCursor = cursor{Kind: "audit", ID: out.Body.Items[in.Limit-1].ID}.encode()
			}
			return out, nil
		})
}

// Whoami is the caller as the API sees it.
type Whoami struct {
	Subject string   `json:"subject"`
	Scopes  []string `json:"scopes" doc:"A client (the dashboard) hides what the token may not do"`
}

type whoamiOutput struct {
	Body Whoami
}

func (s *server) registerWhoami(api huma.API) {
	huma.Register(api, op("whoami", http.MethodGet, "/v1/whoami", "Who the token acts as, with its scopes", "auth"),
		func(ctx context.Context, _ *struct{}) (*whoamiOutput, error) {
			return &whoamiOutput{Body: Whoami{Subject: subject(ctx), Scopes: scopes(ctx)}}, nil
		})
}
