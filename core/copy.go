package core

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// copyMin is the smallest batch worth COPY's extra round trips.
const copyMin = 256

// copier is a pgx handle that can COPY: pgx.Tx, *pgx.Conn, *pgxpool.Pool,
// *pgxpool.Conn.
type copier interface {
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// copyable reports whether a batch can go through COPY: large, on pgx,
// without unique keys (which need ON CONFLICT) and without run-at or delays
// (which COPY cannot compute on the database's clock).
func copyable(db DB, rows []enqueueRow) (copier, bool) {
	c, ok := db.(copier)
	if !ok || len(rows) < copyMin {
		return nil, false
	}
	for _, r := range rows {
		if r.UniqueKey != nil || r.RunAt != nil || r.DelayUS != 0 {
			return nil, false
		}
	}
	return c, true
}

// enqueueCopy writes rows with COPY in binary format — no JSON to build or
// parse — after drawing their ids from the identity's sequence. On a pool
// or connection it opens its own transaction, in which the insert trigger
// leaves the wake-up to the caller (relay.notify = after).
func enqueueCopy(ctx context.Context, c copier, rows []enqueueRow, ownTx bool) ([]EnqueueResult, error) {
	if ownTx {
		if b, ok := c.(beginner); ok {
			var res []EnqueueResult
			err := pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, sqlNotifyAfterCommit); err != nil {
					return err
				}
				var err error
				res, err = copyRows(ctx, tx, rows)
				return err
			})
			return res, err
		}
	}
	return copyRows(ctx, c, rows)
}

func copyRows(ctx context.Context, c copier, rows []enqueueRow) ([]EnqueueResult, error) {
	idRows, err := c.Query(ctx, sqlDrawIDs, len(rows))
	if err != nil {
		return nil, fmt.Errorf("draw ids: %w", err)
	}
	ids, err := pgx.CollectRows(idRows, pgx.RowTo[int64])
	if err != nil || len(ids) != len(rows) {
		return nil, fmt.Errorf("draw ids: got %d of %d: %v", len(ids), len(rows), err)
	}
	src := make([][]any, len(rows))
	for i, r := range rows {
		var ok *string
		if r.OrderingKey != nil {
			ok = r.OrderingKey
		}
		tags := r.Tags
		if tags == nil {
			tags = []string{}
		}
		src[i] = []any{ids[i], r.Kind, r.Queue, []byte(r.Args), int16(r.Priority), int32(r.MaxAttempts), []byte(r.Metadata), ok, tags}
	}
	n, err := c.CopyFrom(ctx, pgx.Identifier{"relay_jobs"},
		[]string{"id", "kind", "queue", "args", "priority", "max_attempts", "metadata", "ordering_key", "tags"},
		pgx.CopyFromRows(src))
	if err != nil {
		return nil, fmt.Errorf("copy: %w", err)
	}
	if int(n) != len(rows) {
		return nil, fmt.Errorf("copy: wrote %d of %d jobs", n, len(rows))
	}
	res := make([]EnqueueResult, len(rows))
	for i := range ids {
		res[i].ID = ids[i]
	}
	return res, nil
}
