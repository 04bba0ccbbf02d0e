package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
)

// Options tune the helpers. The zero value (or nil) is usable.
type Options struct {
	// TTL is how long a key is remembered after its effect succeeded, or
	// after External's last failed attempt (whose retry keeps the token
	// within it), and at least while it runs: a key never expires before
	// its lease ends, and a running key under a live lease is never taken
	// over. Default 24h.
	TTL time.Duration
	// Lease is how long External holds a key for one attempt before another
	// attempt may take it over. Make it longer than the call's timeout.
	// Default 1 minute.
	Lease time.Duration
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.TTL <= 0 {
		r.TTL = 24 * time.Hour
	}
	if r.Lease <= 0 {
		r.Lease = time.Minute
	}
	return r
}

// ErrInProgress is returned (wrapped) when another attempt holds the key's
// lease. The wrapper asks the core to retry when the lease ends
// (core.RetryIn), so a job handler can return it as it is.
var ErrInProgress = errors.New("idempotency: another attempt is in progress for this key")

// ErrStoredResult is returned (wrapped, with the key and the decode error)
// when a key's stored result does not decode into the caller's type (a row
// written behind the helpers, or by code with another result type). The
// effect was made; the call fails, and so does every call with the key
// until the row is fixed or deleted (the admin API's DELETE
// /v1/idempotency/{scope}/{key} lets the effect run again). Other keys are
// unaffected.
var ErrStoredResult = errors.New("idempotency: stored result does not decode")

// decodeResult decodes a succeeded key's stored result into out.
func decodeResult[T any](scope, key string, stored []byte, out *T) error {
	if err := json.Unmarshal(stored, out); err != nil {
		return fmt.Errorf("%w: key %s/%s into %T: %w", ErrStoredResult, scope, key, *out, err)
	}
	return nil
}

// state is a key as sqlLock reads it.
type state struct {
	status       string
	result       []byte
	token        uuid.UUID
	requestHash  string
	leaseExpired bool
	leaseLeft    float64
	expired      bool
}

// acquire makes owner the holder of (scope, key) in tx: by inserting it,
// or by taking over a key whose lease or life has ended. When the key
// already succeeded it returns the stored state instead (owned false).
// With sweepToo, a new key may also delete a batch of expired keys in tx
// (see sweep): only for a transaction of Relay's own, never a caller's.
func acquire(ctx context.Context, tx dbx.Execer, scope, key string, owner uuid.UUID, lease, ttl time.Duration, reqHash string, sweepToo bool) (st state, owned bool, err error) {
	if scope == "" || key == "" {
		return state{}, false, errors.New("idempotency: scope and key must not be empty")
	}
	var hash *string
	if reqHash != "" {
		hash = &reqHash
	}
	for try := 0; try < 3; try++ {
		found, err := queryRow(ctx, tx, sqlClaim, []any{scope, key, owner, lease.Seconds(), hash, ttl.Seconds()}, &st.token)
		if err == nil && found {
			if sweepToo {
				if err := sweep(ctx, tx, key); err != nil {
					return state{}, false, err
				}
			}
			return st, true, nil
		}
		if err != nil {
			return state{}, false, fmt.Errorf("idempotency: claim key %s/%s: %w", scope, key, err)
		}
		found, err = queryRow(ctx, tx, sqlLock, []any{scope, key}, &st.status, &st.result, &st.token, &st.requestHash,
			&st.leaseExpired, &st.leaseLeft, &st.expired)
		if err != nil {
			return state{}, false, fmt.Errorf("idempotency: read key %s/%s: %w", scope, key, err)
		}
		if !found {
			continue // deleted (expired) between the two statements
		}
		switch {
		case st.status == "running" && reqHash != "" && st.requestHash != "" && st.requestHash != reqHash:
			// A different request never takes a key over, lease or not:
			// the caller refuses it (the middleware's 422).
			return st, false, nil
		case st.status == "running" && st.leaseExpired, st.status == "succeeded" && st.expired:
			// A running key keeps its token even past its expiry: the call
			// it stands for may have reached the service.
			fresh := st.status == "succeeded"
			if found, err := queryRow(ctx, tx, sqlTakeOver, []any{scope, key, owner, lease.Seconds(), hash, ttl.Seconds(), fresh}, &st.token); err != nil || !found {
				if err == nil {
					err = errors.New("the key was not there to take over")
				}
				return state{}, false, fmt.Errorf("idempotency: take over key %s/%s: %w", scope, key, err)
			}
			return st, true, nil
		case st.status == "running":
			left := time.Duration(st.leaseLeft * float64(time.Second))
			return st, false, core.RetryIn(left, fmt.Errorf("%w (%s/%s, lease ends in %s)", ErrInProgress, scope, key, left.Round(time.Millisecond)))
		}
		return st, false, nil // succeeded
	}
	return state{}, false, fmt.Errorf("idempotency: key %s/%s kept disappearing", scope, key)
}

// Expired keys are cleaned up by External and Middleware themselves: one
// new key in sweepEvery (picked by a hash of the key, so that the work
// spreads over callers) deletes up to sweepBatch expired keys in the
// helper's own key transaction, skipping rows other transactions hold. That
// removes sweepBatch/sweepEvery = 4 expired keys per new key on average,
// more than the one each new key will become, so expired keys never pile up
// and no call does more than one bounded batch. Once never sweeps: its
// transaction is the caller's, which must carry only the caller's work (a
// delete of other keys there gave a REPEATABLE READ caller serialization
// failures over rows it never asked for); a Cleaner covers its keys.
const (
	sweepEvery = 16
	sweepBatch = 64
)

func sweep(ctx context.Context, tx dbx.Execer, key string) error {
	h := fnv.New32a()
	h.Write([]byte(key)) //nolint:errcheck
	if h.Sum32()%sweepEvery != 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, sqlDeleteExpired, sweepBatch); err != nil {
		return fmt.Errorf("idempotency: delete expired keys: %w", err)
	}
	return nil
}

// queryRow runs sql on ex and scans its first row into dest: found is
// false when it returned none.
func queryRow(ctx context.Context, ex dbx.Execer, sql string, args []any, dest ...any) (found bool, err error) {
	err = ex.Query(ctx, sql, args, func(r dbx.Scanner) error {
		if found {
			return nil
		}
		found = true
		return r.Scan(dest...)
	})
	return found, err
}

// DeleteExpired deletes up to limit expired keys and returns how many it
// deleted; call it until that is below limit. The helpers already delete
// expired keys in small batches as new keys arrive; call this to reclaim
// space at once (after a traffic peak, say). Keys under a live lease are
// never deleted.
func DeleteExpired(ctx context.Context, pool *pgxpool.Pool, limit int) (int64, error) {
	tag, err := pool.Exec(ctx, sqlDeleteExpired, limit)
	if err != nil {
		return 0, fmt.Errorf("idempotency: delete expired keys: %w", err)
	}
	return tag.RowsAffected(), nil
}

func encode(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("idempotency: encode result: %w", err)
	}
	// A string, not []byte: in pgx's exec and simple-protocol modes (a
	// transaction-pooling PgBouncer's) a []byte goes as bytea.
	return string(b), nil
}
