package core

import (
	"sync"
	"time"
)

// leaseGroup watches the local lease deadlines of the jobs of one claim
// with one timer: a timer per job (armed at the claim, reset at each
// renewal, stopped when its handler returns) put the runtime's timer heap
// on every job's path. The timer fires at the earliest deadline of the jobs
// still running; each renewal only moves a job's deadline (running.deadline),
// so the timer, when it fires, cancels the jobs whose deadline has passed
// and waits again for the earliest of the rest. Deadlines only move later,
// so it never fires after one of them. Once every job of the group has
// ended, the timer is stopped.
type leaseGroup struct {
	c     *Client
	timer *time.Timer
	mu    sync.Mutex
	runs  []*running // nil where a job has ended
	live  int        // non-nil entries of runs
	// sealed: every job of the claim was added; a group with none left
	// running may stop.
	sealed bool
}

// newLeaseGroup starts the group of a claim sent at sent: its jobs' local
// deadlines are leaseBudget after it. Add its jobs with add, then seal it.
func (c *Client) newLeaseGroup(sent time.Time, n int) *leaseGroup {
	g := &leaseGroup{c: c, runs: make([]*running, 0, n)}
	g.timer = time.AfterFunc(time.Until(sent.Add(c.leaseBudget)), g.check)
	return g
}

// add arms r's local lease deadline: leaseBudget after sent, when its claim
// was sent (the group's).
func (g *leaseGroup) add(r *running, sent time.Time) {
	r.deadline.Store(int64(sent.Sub(g.c.epoch) + g.c.leaseBudget))
	g.mu.Lock()
	r.group, r.slot = g, len(g.runs)
	g.runs = append(g.runs, r)
	g.live++
	g.mu.Unlock()
}

// seal says every job of the claim was added.
func (g *leaseGroup) seal() {
	g.mu.Lock()
	g.sealed = true
	if g.live == 0 {
		g.timer.Stop()
	}
	g.mu.Unlock()
}

// remove takes r out of the group (once; later calls do nothing).
func (g *leaseGroup) remove(r *running) {
	g.mu.Lock()
	if r.slot >= 0 && r.slot < len(g.runs) && g.runs[r.slot] == r {
		g.runs[r.slot] = nil
		r.slot = -1
		g.live--
		if g.live == 0 && g.sealed {
			g.timer.Stop()
		}
	}
	g.mu.Unlock()
}

// check is the timer's: it cancels the handlers whose local lease deadline
// has passed and waits for the earliest deadline of those still running.
func (g *leaseGroup) check() {
	now := time.Since(g.c.epoch)
	var passed []*running
	g.mu.Lock()
	kept := g.runs[:0]
	var next time.Duration
	for _, r := range g.runs {
		if r == nil {
			continue
		}
		d := time.Duration(r.deadline.Load())
		if now >= d {
			passed = append(passed, r)
			r.slot = -1
			continue
		}
		if len(kept) == 0 || d < next {
			next = d
		}
		r.slot = len(kept)
		kept = append(kept, r)
	}
	clear(g.runs[len(kept):])
	g.runs, g.live = kept, len(kept)
	if len(kept) > 0 {
		g.timer.Reset(next - now)
	}
	g.mu.Unlock()
	for _, r := range passed {
		g.c.loseLease(r, "not renewed in time (local lease deadline)")
	}
}

// startLease arms the local lease deadline of r, claimed alone by a claim
// sent at sent.
func (c *Client) startLease(r *running, sent time.Time) {
	g := c.newLeaseGroup(sent, 1)
	g.add(r, sent)
	g.seal()
}

// renewLease moves r's local lease deadline to leaseBudget after sent, when
// a renewal that succeeded was sent. A job whose handler returned is left
// alone: its deadline is no longer watched, and nothing re-arms it.
func (c *Client) renewLease(r *running, sent time.Time) {
	if r.lost.Load() || r.done.Load() {
		return
	}
	r.deadline.Store(int64(sent.Sub(c.epoch) + c.leaseBudget))
}

// renewOutcomeLease moves the local lease deadline of r, whose handler
// returned and whose outcome waits to be written (in the completer, or a
// snooze), to leaseBudget after sent, when a renewal that succeeded was
// sent. Nothing watches that deadline: the heartbeat reads it to renew
// only leases that still hold (Client.heartbeat).
func (c *Client) renewOutcomeLease(r *running, sent time.Time) {
	if r.lost.Load() {
		return
	}
	r.deadline.Store(int64(sent.Sub(c.epoch) + c.leaseBudget))
}

// endLease disarms r's local lease deadline once its handler returned (or
// will never run): no renewal re-arms it, and it loses no lease.
func (c *Client) endLease(r *running) {
	r.done.Store(true)
	if g := r.group; g != nil {
		g.remove(r)
	}
}

// leasePassed says whether r's local lease deadline has passed.
func (c *Client) leasePassed(r *running) bool {
	return time.Since(c.epoch) >= time.Duration(r.deadline.Load())
}
