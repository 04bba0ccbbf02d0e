package workflow

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
)

// SetEvent publishes value (JSON) under key for readers outside the run
// (GetEvent): progress, a status, an intermediate result. It is a step
// ("event:<key>#<n>"): published once, in its checkpoint's transaction, and
// skipped on replay, so a reader never sees a value go back in time.
func SetEvent(wctx Context, key string, value any) error {
	x := wctx.x
	if err := x.enter("SetEvent"); err != nil {
		return err
	}
	x.eventSeq[key]++
	skey := fmt.Sprintf("event:%s#%d", key, x.eventSeq[key])
	pos, h := x.next("event", skey)
	if h != nil {
		return nil
	}
	x.checkCancel()
	enc, err := encode("event "+key, value)
	if err != nil {
		return fmt.Errorf("workflow: run %s: set event: %w", x.runID, err)
	}
	x.fenced(func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlSetEvent, x.runID, key, string(enc)); err != nil {
			return err
		}
		_, err := x.upsert(ctx, tx, &stepRow{position: pos, key: skey, kind: "event", state: stepCompleted}, 1, nil, 0)
		return err
	})
	return nil
}

// GetEvent reads the latest value run id published under key, decoded into
// T; ok is false when none was published yet.
func GetEvent[T any](ctx context.Context, db core.DB, id, key string) (value T, ok bool, err error) {
	ex, err := dbx.For(db)
	if err != nil {
		return value, false, fmt.Errorf("workflow: get event %s of run %s: %w", key, id, err)
	}
	var raw string
	if err := ex.Query(ctx, sqlGetEvent, []any{id, key}, func(r dbx.Scanner) error { ok = true; return r.Scan(&raw) }); err != nil {
		return value, false, fmt.Errorf("workflow: get event %s of run %s: %w", key, id, err)
	}
	if !ok {
		return value, false, nil
	}
	if err := json.Unmarshal([]byte(raw), &value); err != nil {
		return value, true, fmt.Errorf("workflow: get event %s of run %s: decode into %T: %w", key, id, value, err)
	}
	return value, true, nil
}

// ContinueAsNew ends this generation of the run and starts it again from
// the top with input, under the same run id and with an empty history: a
// run that loops forever (a poller, a monthly cycle) stays cheap to replay.
// The run's signals wait in its mailbox; its events are kept. It returns
// only an error (an input that does not encode); otherwise the execution
// ends here.
func ContinueAsNew(wctx Context, input any) error {
	x := wctx.x
	if err := x.enter("ContinueAsNew"); err != nil {
		return err
	}
	x.checkCancel()
	enc, err := encode("input of ContinueAsNew", input)
	if err != nil {
		return fmt.Errorf("workflow: run %s: continue as new: %w", x.runID, err)
	}
	x.fenced(func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlContinueAsNew, x.runID, string(enc)); err != nil {
			return err
		}
		if x.openChildren() { // children do not outlive their generation
			if err := x.cancelChildren(ctx, tx); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, sqlDropHistory, x.runID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqlDropStaleHeartbeats, x.runID)
		return err
	})
	x.suspend(0)
	return nil
}
