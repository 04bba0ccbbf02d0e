package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/dbx"
)

// External makes a call to an outside service at most once per successful
// attempt and hands every attempt the same token for (scope, key):
//
//  1. it commits the key as running under a lease (Options.Lease), or takes
//     over a key whose lease expired; if the key already succeeded it
//     returns the stored result (replayed true) without calling fn; if
//     another attempt holds a live lease it returns ErrInProgress, wrapped so
//     that a job handler returning it is retried when the lease ends;
//  2. it calls fn with the token — pass it to the service as its
//     idempotency key;
//  3. it records fn's result, or, if fn failed, lets the next attempt go at
//     once.
//
// This is at-least-once, not exactly-once: if the process dies after fn's
// call reached the service and before step 3 commits, the next attempt calls
// fn again, with the same token. The service's own idempotency support (or a
// check in fn before acting) closes that gap; the token is what makes it
// possible.
func External[T any](ctx context.Context, pool *pgxpool.Pool, scope, key string, fn func(ctx context.Context, token string) (T, error), opts *Options) (result T, replayed bool, err error) {
	o := opts.withDefaults()
	owner := uuid.New()
	var st state
	var owned bool
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		st, owned, err = acquire(ctx, dbx.PGX{Q: tx}, scope, key, owner, o.Lease, o.TTL, "", true)
		return err
	})
	if err != nil {
		return result, false, err
	}
	if !owned {
		if err := decodeResult(scope, key, st.result, &result); err != nil {
			return result, false, err
		}
		return result, true, nil
	}

	result, err = fn(ctx, st.token.String())
	// Record the outcome even if ctx was cancelled meanwhile: the call
	// happened (or failed) either way. Bounded by the lease: past it the
	// key may be taken over anyway, and an unresponsive database must not
	// hold the caller for ever.
	recCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.Lease)
	defer cancel()
	if err != nil {
		if _, rerr := pool.Exec(recCtx, sqlRelease, scope, key, owner, o.TTL.Seconds()); rerr != nil {
			return result, false, errors.Join(err, fmt.Errorf("idempotency: release key %s/%s: %w", scope, key, rerr))
		}
		return result, false, err
	}
	enc, err := encode(result)
	if err != nil {
		return result, false, err
	}
	tag, err := pool.Exec(recCtx, sqlSucceed, scope, key, owner, enc, o.TTL.Seconds())
	if err != nil {
		return result, false, fmt.Errorf("idempotency: record key %s/%s (the call was made; a retry repeats it with the same token): %w", scope, key, err)
	}
	if tag.RowsAffected() == 0 {
		// Our lease ran out during the call and another attempt took the
		// key over; it will record its own result. Ours still happened.
		return result, false, nil
	}
	return result, false, nil
}
