package core

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/relayq/relay/testkit/testdb"
)

// A running job cancelled while the client's listener was not listening
// (before its first LISTEN, or while it reconnected) is cancelled with
// ErrJobCancelled when the listener connects, not left to its next
// heartbeat (which would report ErrLeaseLost); a running job that was not
// cancelled is left alone.
func TestCancelMissedWhileNotListening(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	c := &Client{pool: pool, own: pool, outcomes: pool, logger: slog.Default(), leaseBudget: 10 * time.Second}
	track := func() *running {
		res, err := Enqueue(ctx, pool, floorArgs{}, &EnqueueOpts{Queue: "missed"})
		if err != nil {
			t.Fatal(err)
		}
		var token [16]byte
		if err := pool.QueryRow(ctx, `UPDATE relay_jobs SET state = 'claimed', attempt = 1, attempted_at = now(),
			lease_token = $2, lease_expires_at = now() + interval '1 minute' WHERE id = $1 RETURNING lease_token`,
			res.ID, uuid.New()).Scan(&token); err != nil {
			t.Fatal(err)
		}
		hctx, cancel := context.WithCancelCause(ctx)
		r := &running{row: &JobRow{ID: res.ID, LeaseToken: token}, ctx: hctx, cancel: cancel}
		c.inflight.Store(res.ID, r)
		return r
	}
	cancelled, untouched := track(), track()
	// Cancelled behind the client's back: the notification went to nobody.
	if _, err := pool.Exec(ctx, sqlCancel, cancelled.row.ID); err != nil {
		t.Fatal(err)
	}
	c.cancelMissed(ctx)
	if cause := context.Cause(cancelled.ctx); !errors.Is(cause, ErrJobCancelled) {
		t.Fatalf("cancelled job's handler cause %v, want ErrJobCancelled", cause)
	}
	if cause := context.Cause(untouched.ctx); cause != nil {
		t.Fatalf("running job's handler cancelled: %v", cause)
	}
}
