package core

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/internal/dbx"
)

// heartbeatLoop renews the leases of every running job of this client in one
// statement per tick, and those of the attempts whose outcome waits in the
// completer. A job whose lease is gone (rescued after a stall, or
// cancelled) has its handler's context cancelled with ErrLeaseLost; so has
// one whose lease was not renewed in time (see leaseGroup), whatever
// the reason: the database unreachable, or its row locked by another
// transaction.
func (c *Client) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.heartbeat(ctx)
	}
}

// heartbeat renews, in one statement, the leases of the running jobs
// (those in flight, not lost, not completed in their handler's
// transaction) and of the attempts whose outcome the completer has yet to
// write (completer.leased) or whose snooze is being written. A finished attempt is renewed only while its
// local lease deadline has not passed, the deadline a running job's
// handler would be cancelled at: a renewal is sent only for a lease that
// still holds by this client's clock, never for one that may have expired.
// A finished attempt found without its lease is left to the completer,
// whose fence counts it.
func (c *Client) heartbeat(ctx context.Context) {
	var runs []*running
	c.inflight.Range(func(_, v any) bool {
		if r := v.(*running); !r.lost.Load() && !r.completedInTx.Load() {
			runs = append(runs, r)
		}
		return true
	})
	// A job whose handler returned between the two looks is in both: its
	// id goes twice, and is renewed once.
	nRunning := len(runs)
	if c.completer != nil {
		runs = c.completer.leased(runs)
	}
	c.snoozing.Range(func(k, _ any) bool {
		if r := k.(*running); !r.lost.Load() && !c.leasePassed(r) {
			runs = append(runs, r)
		}
		return true
	})
	if len(runs) == 0 {
		return
	}
	ids := make([]int64, len(runs))
	tokens := make([]pgtype.UUID, len(runs))
	for i, r := range runs {
		ids[i], tokens[i] = r.row.ID, leaseToken(r.row.LeaseToken)
	}
	// A renewal counts from when it was sent: the database's new expiry is
	// later than that.
	sent := time.Now()
	qctx, cancel := context.WithTimeout(ctx, c.leaseBudget/2)
	defer cancel()
	res, err := c.beats.Query(qctx, sqlHeartbeat, ids, tokens, c.cfg.LeaseDuration.Milliseconds())
	if err != nil {
		c.logger.Warn("relay: heartbeat failed", "jobs", len(runs), "error", err)
		return
	}
	held, err := scanFenced(res, len(runs))
	if err != nil {
		c.logger.Warn("relay: heartbeat failed", "jobs", len(runs), "error", err)
		return
	}
	skipped := 0
	for _, r := range runs[nRunning:] {
		if held[r.row.ID] {
			c.renewOutcomeLease(r, sent)
		}
	}
	for _, r := range runs[:nRunning] {
		renewed, ok := held[r.row.ID]
		switch {
		case renewed:
			c.renewLease(r, sent)
		case ok:
			skipped++ // its row is locked elsewhere: not renewed this tick
		default:
			// Only a job still running with the same attempt has lost its
			// lease; one that finished meanwhile simply cleared it.
			if v, ok := c.inflight.Load(r.row.ID); ok && v.(*running) == r {
				c.loseLease(r, "rescued or cancelled")
			}
		}
	}
	if skipped > 0 {
		c.logger.Debug("relay: leases not renewed this tick: their rows are locked by another transaction", "jobs", skipped)
	}
}

// rescue ends expired leases in batches until none remain. A rescued job
// waits its retry delay, as after any failed attempt (the client's or its
// kind's RetryPolicy, given an error wrapping ErrLeaseLost), so a job that
// crashes its workers does not take the next worker down at once.
func (c *Client) rescue(ctx context.Context) {
	const batch = 1000
	for ctx.Err() == nil {
		n, err := c.rescueBatch(ctx, batch)
		if err != nil {
			if ctx.Err() == nil { // not a stop
				c.logger.Warn("relay: rescue failed", "error", err)
			}
			return
		}
		c.stats.rescued.Add(int64(n))
		if n < batch {
			return
		}
	}
}

// rescueBatch rescues up to limit expired leases in one transaction.
func (c *Client) rescueBatch(ctx context.Context, limit int) (int, error) {
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	rows, err := tx.Query(ctx, sqlRescueExpired, limit)
	if err != nil {
		return 0, err
	}
	var ids, delays []int64
	for rows.Next() {
		var id int64
		var kind, worker string
		var attempt int
		if err := rows.Scan(&id, &kind, &attempt, &worker); err != nil {
			rows.Close()
			return 0, err
		}
		cause := fmt.Errorf("%w: lease expired: worker %s stopped renewing it", ErrLeaseLost, worker)
		ids = append(ids, id)
		delays = append(delays, c.retryDelay(c.workers[kind], attempt, cause).Microseconds())
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	res, err := tx.Query(ctx, sqlRescue, ids, delays)
	if err != nil {
		return 0, err
	}
	type rescued struct {
		id          int64
		kind, state string
		runAt       time.Time
		runID       string
	}
	var done []rescued
	for res.Next() {
		var r rescued
		if err := res.Scan(&r.id, &r.kind, &r.state, &r.runAt, &r.runID); err != nil {
			res.Close()
			return 0, err
		}
		done = append(done, r)
	}
	res.Close()
	if err := res.Err(); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	for _, r := range done {
		if r.state == string(StateDead) {
			c.logger.Warn("relay: rescued job whose lease expired; its attempts are used up and it is dead", withRunID(r.runID, "job_id", r.id, "kind", r.kind)...)
		} else {
			c.logger.Warn("relay: rescued job whose lease expired; it will run again", withRunID(r.runID, "job_id", r.id, "kind", r.kind, "run_at", r.runAt)...)
		}
	}
	return len(done), nil
}

// cleanup deletes finished jobs past their retention, in bounded batches.
func (c *Client) cleanup(ctx context.Context) {
	r := c.cfg.Retention
	for _, k := range []struct {
		state JobState
		keep  time.Duration
	}{{StateSucceeded, r.Succeeded}, {StateCancelled, r.Cancelled}, {StateDead, r.Dead}} {
		if k.keep < 0 {
			continue
		}
		for ctx.Err() == nil {
			n, err := dbx.PGX{Q: c.pool}.Exec(ctx, sqlCleanup, string(k.state), k.keep.Microseconds(), r.BatchSize)
			if err != nil {
				if ctx.Err() == nil { // not a stop
					c.logger.Warn("relay: retention cleanup failed", "state", k.state, "error", err)
				}
				break
			}
			c.stats.deleted.Add(n)
			if n < int64(r.BatchSize) {
				break
			}
		}
	}
}

// handOffSoon asks handOffLoop for a run of its hand-offs; it never blocks (one
// pending request is enough).
func (c *Client) handOffSoon() {
	select {
	case c.handOffNow <- struct{}{}:
	default:
	}
}

// handOffEvery is how often handOffLoop takes the hand-offs left by
// transactions that could not finish their work without waiting: ordering
// keys the commit-time fix could not settle, wake-ups that stepped over a
// held row. Each run is one indexed read of a table that is nearly always
// empty.
const handOffEvery = 5 * time.Second

// handOffLoop takes the hand-offs (takeKeyHandOffs, takeWakeHandOffs) on every 'keys' or
// 'wakes' notification, on every (re)connect of the listener and every
// handOffEvery, until ctx is done. It runs on its own, so a backlog of
// hand-offs never holds up the rescuer.
func (c *Client) handOffLoop(ctx context.Context) {
	t := time.NewTicker(handOffEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.handOffNow:
		case <-t.C:
		}
		c.takeKeyHandOffs(ctx)
		c.takeWakeHandOffs(ctx)
	}
}

// takeKeyHandOffs re-fixes the ordering keys whose commit-time fix could not
// settle them (docs/ordering-keys.md, "Who keeps the flag"), in batches,
// until none is left or the rest are keys whose next job's row is still
// locked (those wait for the next run).
func (c *Client) takeKeyHandOffs(ctx context.Context) {
	const batch = 1000
	for ctx.Err() == nil {
		taken, left, err := c.keyHandOffBatch(ctx, batch)
		if err != nil {
			if ctx.Err() == nil { // not a stop
				c.logger.Warn("relay: re-fix of ordering keys failed", "error", err)
			}
			return
		}
		if taken < batch || left > 0 {
			return
		}
	}
}

// takeWakeHandOffs makes the wake-ups handed off by relay_jobs_wake (a wake-up that
// found the job's row held by another transaction, migration *_job_rewake),
// in batches, until none is left or the rest are jobs whose rows are still
// held. Most holders hold a row for a moment (a claim, a heartbeat, the
// suspension of the run being woken), so those are tried again a few times
// over about 600 ms; what is still held then waits for the next run.
func (c *Client) takeWakeHandOffs(ctx context.Context) {
	const batch = 1000
	again := 10 * time.Millisecond
	for ctx.Err() == nil {
		var taken, left int
		err := func() error {
			qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			// READ COMMITTED whatever the pool's default: under REPEATABLE
			// READ, clients taking the same hand-offs at once fail with
			// serialization errors instead of stepping over each other.
			return pgx.BeginTxFunc(qctx, c.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
				return tx.QueryRow(qctx, sqlRewake, batch).Scan(&taken, &left)
			})
		}()
		if err != nil {
			if ctx.Err() == nil { // not a stop
				c.logger.Warn("relay: handed-off wake-ups failed", "error", err)
			}
			return
		}
		if left > 0 && again <= 320*time.Millisecond {
			select {
			case <-ctx.Done():
				return
			case <-time.After(again):
			}
			again *= 2
			continue
		}
		if taken < batch || left > 0 {
			return
		}
	}
}

// keyHandOffBatch re-fixes up to limit handed-off keys in one READ COMMITTED
// transaction (the re-fix must read what is committed, whatever the
// pool's default isolation).
func (c *Client) keyHandOffBatch(ctx context.Context, limit int) (taken, left int, err error) {
	qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	tx, err := c.pool.BeginTx(qctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return 0, 0, fmt.Errorf("re-fix ordering keys: %w", err)
	}
	defer tx.Rollback(qctx) //nolint:errcheck // after Commit, a no-op
	if err := tx.QueryRow(qctx, sqlRefixKeys, limit).Scan(&taken, &left); err != nil {
		return 0, 0, fmt.Errorf("re-fix ordering keys: %w", err)
	}
	if err := tx.Commit(qctx); err != nil {
		return 0, 0, fmt.Errorf("re-fix ordering keys: commit: %w", err)
	}
	return taken, left, nil
}
