package core

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/relayq/relay/internal/jobinsert"
	"github.com/relayq/relay/testkit/testdb"
)

// A job inserted claimed for an eager caller and cancelled before Adopt
// made it a job in flight: the cancel's notification, heard in between,
// found nothing to cancel (onNotify). Adopt checks for the cancel, so the
// handler is cancelled at once with ErrJobCancelled, not left to its next
// heartbeat (ErrLeaseLost).
func TestEagerCancelHeardBeforeAdopt(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ws := NewWorkers()
	if err := AddWorker(ws, WorkFunc[floorArgs](func(ctx context.Context, _ *Job[floorArgs]) error {
		<-ctx.Done()
		return context.Cause(ctx)
	})); err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(pool, &Config{Workers: ws, Queues: map[string]QueueConfig{"eager": {MaxWorkers: 2}},
		LeaseDuration: time.Minute, RescueInterval: -1, Retention: Retention{Interval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Stop(sctx) //nolint:errcheck
	})
	ins := eagerInserter{c}
	insert := func() (*JobRow, error) {
		l, err := ins.Lend(ctx, "floor", "eager", nil)
		if err != nil {
			return nil, err
		}
		var id int64
		var at time.Time
		if err := pool.QueryRow(ctx, `
			INSERT INTO relay_jobs (kind, queue, state, attempt, attempted_at, attempted_by, lease_token, lease_expires_at)
			VALUES ('floor', 'eager', 'claimed', 1, now(), $1, $2::uuid, now() + $3 * interval '1 millisecond')
			RETURNING id, attempted_at`, l.By, l.Token.String(), l.LeaseMS).Scan(&id, &at); err != nil {
			l.Release()
			return nil, err
		}
		if _, err := pool.Exec(ctx, sqlCancel, id); err != nil {
			l.Release()
			return nil, err
		}
		// The cancel's notification arrives now, before Adopt.
		c.onNotify("relay_control", "cancel:"+strconv.FormatInt(id, 10)+":"+l.Token.String())
		job := l.Adopt(ctx, id, jobinsert.Row{Kind: "floor", Queue: "eager", Args: []byte(`{}`), MaxAttempts: 25}, at)
		go job.Execute(ctx) //nolint:errcheck
		return job.Row, nil
	}
	jr, err := insert()
	if err != nil {
		t.Fatal(err)
	}
	// Adopt returned: the handler knows already.
	if cause := context.Cause(jr.run.ctx); !errors.Is(cause, ErrJobCancelled) {
		t.Fatalf("the handler of a job cancelled before its Adopt: cause %v, want ErrJobCancelled", cause)
	}
}
