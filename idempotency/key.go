package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
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
func acquire(ctx context.Context, tx pgx.Tx, scope, key string, owner uuid.UUID, lease, ttl time.Duration, reqHash string) (st state, owned bool, err error) {
	if scope == "" || key == "" {
		return state{}, false, errors.New("idempotency: scope and key must not be empty")
	}
	var hash *string
	if reqHash != "" {
		hash = &reqHash
	}
	for try := 0; try < 3; try++ {
		err := tx.QueryRow(ctx, sqlClaim, scope, key, owner, lease.Seconds(), hash, ttl.Seconds()).Scan(&st.token)
		if err == nil {
			if err := sweep(ctx, tx, key); err != nil {
				return state{}, false, err
			}
			return st, true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return state{}, false, fmt.Errorf("idempotency: claim key %s/%s: %w", scope, key, err)
		}
		err = tx.QueryRow(ctx, sqlLock, scope, key).Scan(&st.status, &st.result, &st.token, &st.requestHash,
			&st.leaseExpired, &st.leaseLeft, &st.expired)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // deleted (expired) between the two statements
		}
		if err != nil {
			return state{}, false, fmt.Errorf("idempotency: read key %s/%s: %w", scope, key, err)
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
			if err := tx.QueryRow(ctx, sqlTakeOver, scope, key, owner, lease.Seconds(), hash, ttl.Seconds(), fresh).Scan(&st.token); err != nil {
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

// Expired keys are cleaned up by the helpers themselves, so nothing needs to
// be scheduled: one new key in sweepEvery (picked by a hash of the key, so
// that the work spreads over callers) deletes up to sweepBatch expired keys
// in the same transaction, skipping rows other transactions hold. That
// removes sweepBatch/sweepEvery = 4 expired keys per new key on average,
// more than the one each new key will become, so expired keys never pile up
// and no call does more than one bounded batch.
const (
	sweepEvery = 16
	sweepBatch = 64
)

func sweep(ctx context.Context, tx pgx.Tx, key string) error {
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

func encode(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("idempotency: encode result: %w", err)
	}
	return b, nil
}
