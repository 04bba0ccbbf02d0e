package core

import (
	"context"
	"time"

	"github.com/relayq/relay/internal/jobinsert"
)

// maxEnqueueWakeCoalesce bounds Config.EnqueueWakeCoalesce.
const maxEnqueueWakeCoalesce = time.Second

// Enqueue writes one job on the client's pool, traced and counted with the
// client's TracerProvider and MeterProvider (the package-level Enqueue
// uses the global ones). See Enqueue.
//
// Its wake-up of the queue's workers, sent after the commit, coalesces
// over Config.EnqueueWakeCoalesce (see there) instead of the package-level
// Enqueue's 1 ms. A started client that serves the queue wakes its own
// workers at once, in this process, and notifies the others only when its
// view of relay_processes (read every PollInterval) says another live
// process serves the queue too, or is not fresh.
func (c *Client) Enqueue(ctx context.Context, args JobArgs, opts *EnqueueOpts) (EnqueueResult, error) {
	return c.EnqueueTx(ctx, c.pool, args, opts)
}

// EnqueueMany writes a batch of jobs on the client's pool, with the
// client's providers. See EnqueueMany.
func (c *Client) EnqueueMany(ctx context.Context, params []EnqueueParams) ([]EnqueueResult, error) {
	return c.EnqueueManyTx(ctx, c.pool, params)
}

// EnqueueTx writes one job through db (a caller's transaction, usually),
// with the client's providers: the job's attempts then join the trace of
// the span in ctx through the client's TracerProvider even when no global
// provider is set.
func (c *Client) EnqueueTx(ctx context.Context, db DB, args JobArgs, opts *EnqueueOpts) (EnqueueResult, error) {
	res, err := c.EnqueueManyTx(ctx, db, []EnqueueParams{{Args: args, Opts: opts}})
	if err != nil {
		return EnqueueResult{}, err
	}
	return res[0], nil
}

// EnqueueManyTx is EnqueueMany through db with the client's providers.
func (c *Client) EnqueueManyTx(ctx context.Context, db DB, params []EnqueueParams) ([]EnqueueResult, error) {
	return enqueueMany(ctx, db, params, c.cfg.TracerProvider, c.metrics.enqueued, c.wakeWindow(), c.wakeLocal)
}

// wakeWindow is the window over which the client's enqueues on a pool
// coalesce their wake-ups (Config.EnqueueWakeCoalesce, defaulted).
func (c *Client) wakeWindow() time.Duration {
	return c.cfg.EnqueueWakeCoalesce
}

// flushWakeups sends, at once, the wake-ups the client's enqueues (or any
// other caller's) left scheduled on its pool (Stop), bounded by ctx and by
// a second.
func (c *Client) flushWakeups(ctx context.Context) {
	ex, err := execerFor(c.pool)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	jobinsert.FlushWakeups(ctx, c.pool, ex)
}
