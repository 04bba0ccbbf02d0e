package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
)

// ErrNotTransaction is returned by Once for a handle that is not a
// transaction.
var ErrNotTransaction = errors.New("idempotency: Once needs the caller's transaction (pgx.Tx, bun.Tx or *sql.Tx)")

// Once runs fn inside tx unless (scope, key) already succeeded, and stores
// fn's result with the key in tx: the key, fn's writes in tx and the result
// commit together or not at all. Exactly once for effects in this database.
//
// A later call with the key returns the stored result without running fn
// (replayed true). A concurrent call with the key waits for this
// transaction to end, then replays (or runs, if this one rolled back). If fn
// fails, Once removes the key from tx and returns fn's error; roll tx back.
//
// Once writes nothing in tx but its own key: it deletes no expired keys
// there (tx may run at any isolation level). Run a Cleaner to remove the
// expired keys of Once (External and Middleware remove some as they go).
//
// tx is the caller's transaction: a pgx.Tx, bun.Tx (or *bun.Tx) or *sql.Tx
// (as core.DB lists them). Any other handle (a pool, a connection) fails
// with ErrNotTransaction and runs nothing: Once's guarantee is that fn's
// writes and the key commit together, which only the caller's
// transaction can give.
//
// Use it inside a job handler's transaction, before core.CompleteTx:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		_, _, err := idempotency.Once(ctx, tx, "ledger", orderID, func(ctx context.Context) (int64, error) {
//			return insertLedgerEntry(ctx, tx, order)
//		}, nil)
//		if err != nil {
//			return err
//		}
//		return core.CompleteTx(ctx, tx, job)
//	})
func Once[T any](ctx context.Context, tx core.DB, scope, key string, fn func(ctx context.Context) (T, error), opts *Options) (result T, replayed bool, err error) {
	if !dbx.InTransaction(tx) {
		return result, false, fmt.Errorf("%w: got %T", ErrNotTransaction, tx)
	}
	ex, err := dbx.For(tx)
	if err != nil {
		return result, false, fmt.Errorf("idempotency: %w", err)
	}
	o := opts.withDefaults()
	owner := uuid.New()
	// Savepoint-free: the key row is this transaction's until it ends.
	st, owned, err := acquire(ctx, ex, scope, key, owner, o.Lease, o.TTL, "", false)
	if err != nil {
		return result, false, err
	}
	if !owned {
		if err := decodeResult(scope, key, st.result, &result); err != nil {
			return result, false, err
		}
		return result, true, nil
	}
	result, err = fn(ctx)
	if err != nil {
		if _, ferr := ex.Exec(ctx, sqlForget, scope, key, owner); ferr != nil {
			return result, false, fmt.Errorf("%w (and forgetting key %s/%s failed: %v)", err, scope, key, ferr)
		}
		return result, false, err
	}
	enc, err := encode(result)
	if err != nil {
		return result, false, err
	}
	if _, err := ex.Exec(ctx, sqlSucceed, scope, key, owner, enc, o.TTL.Seconds()); err != nil {
		return result, false, fmt.Errorf("idempotency: record key %s/%s: %w", scope, key, err)
	}
	return result, false, nil
}
