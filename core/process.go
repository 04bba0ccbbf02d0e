package core

import (
	"context"
	"fmt"

	"github.com/relayq/relay/internal/liveness"
)

// register records the started client in relay_processes (on its
// bookkeeping pool, which Start has opened): a worker with its queues and
// their slots, or a client without queues.
func (c *Client) register(ctx context.Context) error {
	role := liveness.RoleClient
	queues := map[string]int{}
	for name, q := range c.queues {
		queues[name] = q.max
	}
	if len(queues) > 0 {
		role = liveness.RoleWorker
	}
	p, err := liveness.New(c.own, liveness.Entry{Role: role, Name: c.cfg.ID, Queues: queues, Timeout: c.cfg.LivenessTimeout})
	if err != nil {
		return fmt.Errorf("core: start: %w", err)
	}
	if err := p.Register(ctx, c.own); err != nil {
		return fmt.Errorf("core: start: %w", err)
	}
	c.proc = p
	return nil
}

// unregister deletes the client's entry at Stop, within ctx: when it cannot
// (ctx over, the database unreachable) the entry ages out after
// LivenessTimeout, and the other processes' views say so only then.
func (c *Client) unregister(ctx context.Context) {
	if ctx.Err() != nil {
		c.logger.Warn("relay: stop: no time left to remove the process entry; it ages out after the liveness timeout",
			"process_id", c.proc.ID(), "client_id", c.cfg.ID, "liveness_timeout", c.cfg.LivenessTimeout)
		return
	}
	if err := c.proc.Unregister(ctx); err != nil {
		c.logger.Warn("relay: stop: process entry not removed; it ages out after the liveness timeout",
			"process_id", c.proc.ID(), "client_id", c.cfg.ID, "liveness_timeout", c.cfg.LivenessTimeout, "err", err)
	}
}
