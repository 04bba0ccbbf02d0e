package core

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// The claim floor keeps a queue's claims fast when VACUUM falls behind
// (issue 17, item 3; docs/benchmarks.md, "A job table that stays fast when
// vacuum falls behind").
//
// Every claimed job leaves an entry in the claim index
// (relay_jobs_claim_idx, queued rows only) that points at a row version no
// longer queued. A claim's index scan marks such an entry dead as it
// passes once the version is dead to every snapshot, and VACUUM removes
// it; until then each claim that starts from the front of the index reads
// it again. While a long transaction holds the xmin horizon (an
// idle-in-transaction session, a long report), no entry can be marked or
// removed, so every claim walks every job claimed since that transaction
// began: at 1,000 jobs/s, 60,000 entries a minute, followed to the heap
// one by one.
//
// The floor is a position in claim order (priority, run_at, id) before
// which the queue has no queued job. A claim starts after it (sqlClaimAfter),
// so it never reads what lies before: the dead ground. A keeper goroutine
// per queue maintains it:
//
//   - Off while the front of the index is cheap to walk: every
//     PollInterval (at least a second; see floorCheckSpacing for a client
//     of many queues) it EXPLAINs a probe from the front and counts the
//     buffers it touches. Below floorOffBuffers (or
//     floorOnBuffers, when off) the floor is off and claims are exactly as
//     without it.
//   - On, a full probe from the front (sqlFloorProbe) finds the first job
//     queued in its snapshot, q0, and sets the floor to the smaller of just
//     before q0 and (priority 0, now() − floorLag): a job committed later
//     sorts after that bound unless it has priority 0 and a run_at more than
//     floorLag before the probe (see below).
//   - Every floorStep a forward probe from the floor (sqlFloorProbeAfter,
//     as cheap as a claim) raises the floor the same way, so the claims
//     never walk more than about floorLag+floorStep of dead entries.
//   - The EXPLAIN and the full probe are repeated every 20 times their own
//     time, between 1 s and 15 s: the full probe may lower the floor again,
//     and that is how a job that became queued behind the floor is found.
//     (Both walk the dead ground; so they cost at most about a tenth of one
//     backend's time.)
//
// Jobs that can land behind the floor, and so wait up to one full-probe
// period (while the floor is on only): priority-0 jobs whose run_at is more
// than floorLag older than the moment they become visible — enqueued with
// an explicit RunAt in the past, enqueued by a transaction that ran longer
// than floorLag before committing (run_at is the transaction's now()), or
// given back by a shutdown (a released job keeps its run_at). Jobs of any
// other priority never do: the floor's priority is always 0, so it bounds
// the walk of priority-0 jobs only. Jobs that were queued when a probe ran
// never do: the floor stays before them, blocked ordering keys included.
type claimFloor struct {
	mu sync.Mutex
	on bool
	at claimCursor
}

const (
	// floorLag is how far before a probe's now() the floor stays: a job
	// enqueued in a transaction that committed within floorLag of its
	// start sorts after the floor.
	floorLag = 250 * time.Millisecond
	// floorStep is the forward probes' period.
	floorStep = 100 * time.Millisecond
	// floorOnBuffers turns the floor on: a walk from the front of the
	// claim index touching this many buffers has passed thousands of dead
	// entries. floorOffBuffers turns it off again.
	floorOnBuffers  = 100
	floorOffBuffers = 25
	// floorProbeTimeout bounds each probe. The probes use the caller's
	// pool, which handlers may hold; a full probe or an EXPLAIN that fails
	// (or waits this long for a connection) turns the floor off, so a job
	// behind the floor never waits on a keeper that cannot run.
	floorProbeTimeout = 10 * time.Second
	// floorCheckSpacing spreads the EXPLAINs of a client's keepers while
	// their floors are off: a queue that claimed fewer than floorCheckJobs
	// jobs since its last check is checked every PollInterval, at least a
	// second, or every floorCheckSpacing times the client's number of
	// queues if that is longer, so a client of many quiet queues sends at
	// most about 100 a second. An EXPLAIN is planned afresh each time
	// (~0.5 ms of server time); 1,000 queues checked every second spent
	// more of PostgreSQL's CPU on them than on their claims
	// (docs/benchmarks.md, "Cost as the work grows"). Dead entries come
	// from claims: a queue that claimed few jobs since its last check has
	// few more of them, and the spaced check (which also sees other
	// processes' claims) is soon enough.
	floorCheckSpacing = 10 * time.Millisecond
	// floorCheckJobs claimed since a queue's last check make it due at
	// the unspaced period: a queue that hot (500 jobs a second or more)
	// lays hundreds of dead entries a second while a horizon is held, a
	// claim index walk of floorOnBuffers within a few seconds.
	floorCheckJobs = 500
)

// get returns the floor, if on.
func (f *claimFloor) get() (claimCursor, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.at, f.on
}

func (f *claimFloor) set(on bool, at claimCursor) {
	f.mu.Lock()
	f.on, f.at = on, at
	f.mu.Unlock()
}

// keepFloor maintains q.floor until ctx is done (see claimFloor).
func (q *queue) keepFloor(ctx context.Context) {
	c := q.client
	idle := max(c.cfg.PollInterval, time.Second)
	spaced := c.floorCheckPeriod()
	// Nothing to look at before the client has claimed for a while; and
	// a client's start is busy enough.
	sleepCtx(ctx, idle)
	// A random part spreads the spaced checks of a client's queues over
	// their period.
	last := time.Now().Add(-rand.N(spaced))
	for ctx.Err() == nil {
		_, on := q.floor.get()
		if !on && !q.floorCheckDue(time.Since(last), spaced) {
			sleepCtx(ctx, idle)
			continue
		}
		last = time.Now()
		q.floorClaims.Store(0)
		began := time.Now()
		bufs, err := q.frontCost(ctx)
		if err != nil || bufs < floorOffBuffers || (!on && bufs < floorOnBuffers) {
			if on {
				c.logger.Info("relay: claim floor off: the front of the claim index is clear again", "queue", q.name, "buffers", bufs, "error", err)
			}
			q.floor.set(false, claimCursor{})
			sleepCtx(ctx, idle)
			continue
		}
		at, err := q.probeFloor(ctx, nil)
		if err != nil {
			if on {
				c.logger.Info("relay: claim floor off", "queue", q.name, "error", err)
			}
			q.floor.set(false, claimCursor{})
			sleepCtx(ctx, idle)
			continue
		}
		if !on {
			c.logger.Info("relay: claim floor on: dead index entries at the front of the claim index (VACUUM is behind; is a long transaction holding the xmin horizon?); claims start after them",
				"queue", q.name, "buffers", bufs)
		}
		q.floor.set(true, at)
		period := min(max(20*time.Since(began), time.Second), 15*time.Second)
		for until := time.Now().Add(period); ctx.Err() == nil && time.Now().Before(until); {
			sleepCtx(ctx, floorStep)
			next, err := q.probeFloor(ctx, &at)
			if err != nil {
				continue
			}
			if at.less(next) {
				at = next
				q.floor.set(true, at)
			}
		}
	}
	q.floor.set(false, claimCursor{})
}

// floorCheckPeriod is how often each of c's keepers measures the front of
// a quiet queue's claim index while its floor is off: every PollInterval,
// at least a second, and at least floorCheckSpacing times the number of
// queues c serves, so that c's quiet queues send at most about 100 such
// EXPLAINs a second.
func (c *Client) floorCheckPeriod() time.Duration {
	return max(c.cfg.PollInterval, time.Second, time.Duration(len(c.queues))*floorCheckSpacing)
}

// floorCheckDue says whether q's front is to be measured now, since after
// its last measurement: the spaced period has passed, or q claimed
// floorCheckJobs jobs since (the keeper wakes every PollInterval, at least
// a second, to ask).
func (q *queue) floorCheckDue(since, spaced time.Duration) bool {
	return since >= spaced || q.floorClaims.Load() >= floorCheckJobs
}

// probeFloor returns a floor for queue q from a probe: from the front of
// the claim index (after nil) or from the floor after.
func (q *queue) probeFloor(ctx context.Context, after *claimCursor) (claimCursor, error) {
	sql, args := sqlFloorProbe, []any{q.name}
	if after != nil {
		sql, args = sqlFloorProbeAfter, append(args, int16(after.priority), after.runAt, after.id)
	}
	ctx, cancel := context.WithTimeout(ctx, floorProbeTimeout)
	defer cancel()
	var now time.Time
	var prio *int16
	var runAt *time.Time
	var id *int64
	if err := q.client.pool.QueryRow(ctx, sql, args...).Scan(&now, &prio, &runAt, &id); err != nil {
		return claimCursor{}, fmt.Errorf("probe the claim floor: %w", err)
	}
	at := claimCursor{0, now.Add(-floorLag), 0}
	if id != nil {
		if first := (claimCursor{int(*prio), *runAt, *id - 1}); first.less(at) {
			at = first
		}
	}
	return at, nil
}

// frontCost returns the shared buffers a probe from the front of q's claim
// index touches.
func (q *queue) frontCost(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, floorProbeTimeout)
	defer cancel()
	var js []byte
	if err := q.client.pool.QueryRow(ctx, sqlFloorCost, q.name).Scan(&js); err != nil {
		return 0, fmt.Errorf("measure the claim index's front: %w", err)
	}
	var plan []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(js, &plan); err != nil || len(plan) != 1 {
		return 0, fmt.Errorf("measure the claim index's front: unexpected EXPLAIN output: %v", err)
	}
	return plan[0].Plan.Hit + plan[0].Plan.Read, nil
}

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
