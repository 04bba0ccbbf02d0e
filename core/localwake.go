package core

import (
	"context"
	"sync"
	"time"
)

// A started client's own enqueues (Client.Enqueue and its kin, each its
// own transaction on a pool) wake its fetch loops of their queues directly
// after the commit, in this process, without the round trip of a NOTIFY
// through PostgreSQL. The NOTIFY is still sent when another live process
// serves the queue (its entry in relay_processes names it), when this
// client does not serve it, and whenever the client's view of the other
// processes is not fresh; it is skipped only when the view, at most two
// PollIntervals old, says no other process serves the queue. Each NOTIFY
// skipped saves a statement and its transaction, and a delivery to every
// listening client.
//
// A worker process that starts serving the queue after the view was read
// is not notified until the next read, at most a PollInterval later: its
// first claim at Start finds the jobs committed before it, and its poll
// those after (the guarantee of a missed notification: at most a poll
// interval). This client's own loops take them meanwhile.
//
// An enqueue inside a caller's transaction is not covered: its wake-up is
// the insert trigger's NOTIFY, which rides on that commit.

// sqlPeerQueues lists the queues some live process other than $1 serves.
const sqlPeerQueues = `
SELECT DISTINCT q
FROM relay_processes, jsonb_object_keys(queues) AS q
WHERE id <> $1 AND relay_process_live(heartbeat_at, liveness_secs)`

// peerView is what a started client last read of the queues other live
// processes serve.
type peerView struct {
	mu     sync.Mutex
	at     time.Time // when it was read (zero: never)
	queues map[string]bool
}

// alone reports whether the view, read within maxAge, says that no other
// live process serves queue (false when the view is older).
func (v *peerView) alone(queue string, maxAge time.Duration) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return !v.at.IsZero() && time.Since(v.at) <= maxAge && !v.queues[queue]
}

// refreshPeers reads the view again. A failure leaves the old one to age:
// once stale, every enqueue notifies again.
func (c *Client) refreshPeers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	read := time.Now()
	rows, err := c.own.Query(ctx, sqlPeerQueues, c.proc.ID())
	if err != nil {
		return err
	}
	defer rows.Close()
	queues := map[string]bool{}
	for rows.Next() {
		var q string
		if err := rows.Scan(&q); err != nil {
			return err
		}
		queues[q] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	c.peers.mu.Lock()
	c.peers.at, c.peers.queues = read, queues
	c.peers.mu.Unlock()
	return nil
}

// peersLoop reads the view every PollInterval until ctx ends. A failed
// read is logged at debug level only: enqueues then notify, as without the
// view, and nothing is lost.
func (c *Client) peersLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.refreshPeers(ctx); err != nil && ctx.Err() == nil {
			c.logger.Debug("relay: could not read which queues other processes serve; enqueues notify them all", "error", err)
		}
	}
}

// wakeLocal wakes this client's fetch loops of the queues an enqueue of
// its own just committed jobs to, and returns the queues whose workers in
// other processes must still be notified (see above).
func (c *Client) wakeLocal(queues []string) []string {
	if !c.live.Load() || len(c.queues) == 0 {
		return queues
	}
	notify := queues[:0:0]
	for _, name := range queues {
		q, ok := c.queues[name]
		if !ok {
			notify = append(notify, name)
			continue
		}
		q.rescan.Store(true)
		q.notify()
		if !c.peers.alone(name, 2*c.cfg.PollInterval) {
			notify = append(notify, name)
		}
	}
	return notify
}
