package core

import (
	"context"
	"time"

	"github.com/relayq/relay/internal/dbx"
)

// heartbeatLoop renews the leases of every running job of this client in one
// statement per tick. A job whose lease is gone (rescued after a stall, or
// cancelled) has its handler's context cancelled with ErrLeaseLost.
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

func (c *Client) heartbeat(ctx context.Context) {
	var rows []*JobRow
	c.inflight.Range(func(_, v any) bool {
		rows = append(rows, v.(*running).row)
		return true
	})
	if len(rows) == 0 {
		return
	}
	ids, tokens := idsAndTokens(rows)
	res, err := c.pool.Query(ctx, sqlHeartbeat, ids, tokens, c.cfg.LeaseDuration.Milliseconds())
	if err != nil {
		c.logger.Warn("relay: heartbeat failed", "jobs", len(rows), "error", err)
		return
	}
	renewed := make(map[int64]bool, len(rows))
	for res.Next() {
		var id int64
		if err := res.Scan(&id); err == nil {
			renewed[id] = true
		}
	}
	res.Close()
	if res.Err() != nil {
		c.logger.Warn("relay: heartbeat failed", "jobs", len(rows), "error", res.Err())
		return
	}
	for _, r := range rows {
		if renewed[r.ID] {
			continue
		}
		// Only a job still running with the same attempt has lost its lease;
		// one that finished meanwhile simply cleared it.
		if v, ok := c.inflight.Load(r.ID); ok && v.(*running).row == r {
			c.stats.leaseLost.Add(1)
			c.logger.Warn("relay: lease lost while running; cancelling the handler", "job_id", r.ID, "kind", r.Kind, "attempt", r.Attempt)
			v.(*running).cancel(ErrLeaseLost)
		}
	}
}

// rescue ends expired leases in batches until none remain.
func (c *Client) rescue(ctx context.Context) {
	for ctx.Err() == nil {
		rows, err := c.pool.Query(ctx, sqlRescue, 1000)
		if err != nil {
			c.logger.Warn("relay: rescue failed", "error", err)
			return
		}
		n := 0
		for rows.Next() {
			var id int64
			var kind, state string
			if err := rows.Scan(&id, &kind, &state); err != nil {
				break
			}
			n++
			c.logger.Warn("relay: rescued job whose lease expired", "job_id", id, "kind", kind, "now", state)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			c.logger.Warn("relay: rescue failed", "error", err)
			return
		}
		c.stats.rescued.Add(int64(n))
		if n < 1000 {
			return
		}
	}
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
				c.logger.Warn("relay: retention cleanup failed", "state", k.state, "error", err)
				break
			}
			c.stats.deleted.Add(n)
			if n < int64(r.BatchSize) {
				break
			}
		}
	}
}
