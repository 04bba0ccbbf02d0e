package core

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/relayq/relay/internal/eager"
	"github.com/relayq/relay/internal/jobinsert"
)

// Eager execution: a caller inserts a job already claimed by a Client and
// runs it in its own goroutine, with no queue hop (no NOTIFY, no claim, no
// hand-over to an executor). The workflow layer's eager start
// (workflow.RunNow) is built on it, after Temporal's Eager Workflow Start.
//
// From the moment its claim commits the job is a claimed job of the client
// like any other: it holds one of its queue's worker slots, its lease is
// renewed by the client's heartbeats, a cancel or a lost lease cancels its
// handler, Stop waits for it (and interrupts it at its deadline), its
// outcome is fenced by its lease token, and if the process dies the lease
// expires and the rescuer puts it back in the queue for any worker.

// ErrCallerGone is the cause of an eager job's handler cancellation when
// the caller executing it stopped waiting (the workflow layer's Execute):
// the attempt is returned to the queue without being counted, as at a
// shutdown, and any worker continues the job.
var ErrCallerGone = errors.New("core: the caller executing the job stopped waiting")

// returnedUncounted reports whether an attempt cancelled with cause goes back to
// the queue without being counted: a shutdown, or an eager caller gone.
func returnedUncounted(cause error) bool {
	return errors.Is(cause, ErrShutdown) || errors.Is(cause, ErrCallerGone)
}

// eagerInserter is a client's eager.Inserter, handed to the workers that
// ask for it (eager.Attacher) when the client is made.
type eagerInserter struct{ c *Client }

// Claim implements eager.Inserter: see there. The job runs in lend's
// worker slot, which lend's handler does not use meanwhile (it waits in
// Execute).
func (e eagerInserter) Claim(ctx context.Context, id int64, kind, queue string, lend *JobRow) (eager.Job[*JobRow], error) {
	cl, err := e.c.claimForCaller(ctx, id, kind, queue, lend)
	if err != nil {
		return eager.Job[*JobRow]{}, err
	}
	job := eager.Job[*JobRow]{ID: cl.id, Row: cl.row}
	job.Execute = func(ctx context.Context) error { return e.c.execute(ctx, cl) }
	return job, nil
}

// claimedJob is a job claimed for an eager caller (Claim, Lent.Adopt): row
// is nil when nothing was claimed, r nil once executed. lent: it runs in
// its caller's worker slot, not in one of the queue's own (Lend with no
// lending job, which Execute frees).
type claimedJob struct {
	id   int64
	row  *JobRow
	q    *queue
	r    *running
	lent bool
}

// claimForCaller claims queued job id for lend's handler to execute in
// its slot (eagerInserter.Claim).
func (c *Client) claimForCaller(ctx context.Context, id int64, kind, queue string, lend *JobRow) (*claimedJob, error) {
	q, err := c.lendSlot(fmt.Sprintf("claim %s job %d", kind, id), kind, queue, lend)
	if err != nil {
		return nil, err
	}
	cl, err := c.claimKnown(ctx, q, id, kind, queue)
	if err != nil || cl.row == nil {
		q.active.Add(-1)
		c.jobs.Done()
		if err == nil {
			err = fmt.Errorf("core: claim %s job %d: %w: not queued for a first attempt, or held by a pause or a limit", kind, id, eager.ErrUnavailable)
		}
		return nil, err
	}
	cl.lent = true
	return cl, nil
}

// lendSlot reserves lend's worker slot on queue for a job of kind that
// lend's handler waits for (what names the job in errors), counted as a
// claimed job of the queue and of the client (Stop waits for it); the
// caller undoes both if the job is not adopted.
func (c *Client) lendSlot(what, kind, queueName string, lend *JobRow) (*queue, error) {
	q := c.queues[queueName]
	if lend == nil || lend.Queue != queueName || q == nil || c.workers[kind] == nil {
		return nil, fmt.Errorf("core: %s on queue %q: %w", what, queueName, eager.ErrNotWorked)
	}
	if v, ok := c.inflight.Load(lend.ID); !ok || v.(*running).row != lend || v.(*running).done.Load() {
		return nil, fmt.Errorf("core: %s: the lending job %d is not running in this client: %w", what, lend.ID, eager.ErrNotWorked)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || !c.live.Load() {
		return nil, fmt.Errorf("%w: the client is not running", eager.ErrUnavailable)
	}
	q.active.Add(1)
	c.jobs.Add(1) // under q.mu, before close: Stop's wait sees it
	return q, nil
}

// Lend implements eager.Inserter: see there. The job runs in lend's
// worker slot, as Claim's does; with lend nil, in a slot of the queue's
// own, as Insert's does.
func (e eagerInserter) Lend(ctx context.Context, kind, queue string, lend *JobRow) (*eager.Lent[*JobRow], error) {
	c := e.c
	own := lend == nil
	q := c.queues[queue]
	if own {
		if q == nil || c.workers[kind] == nil {
			return nil, fmt.Errorf("core: reserve a slot for a %s job on queue %q: %w", kind, queue, eager.ErrNotWorked)
		}
		if err := q.takeSlot(); err != nil {
			return nil, fmt.Errorf("core: reserve a slot for a %s job on queue %q: %w", kind, queue, err)
		}
	} else {
		var err error
		if q, err = c.lendSlot("lend a slot to a "+kind+" job", kind, queue, lend); err != nil {
			return nil, err
		}
	}
	// The lease runs, at the earliest, from now: the local deadline
	// counts from here, as for a claim. The job's cancel can only be
	// heard after this (after the insert's commit).
	sent, notes := time.Now(), c.cancelNotes.Load()
	var settled atomic.Bool
	l := &eager.Lent[*JobRow]{By: c.cfg.ID, Token: uuid.New(), LeaseMS: c.cfg.LeaseDuration.Milliseconds(), Producer: e.Producer()}
	l.Release = func() {
		if settled.CompareAndSwap(false, true) {
			q.active.Add(-1)
			c.jobs.Done()
			if own {
				q.releaseSlot()
			}
		}
	}
	l.Adopt = func(ctx context.Context, id int64, row jobinsert.Row, at time.Time) eager.Job[*JobRow] {
		cl := &claimedJob{id: id, q: q, lent: !own}
		if settled.CompareAndSwap(false, true) {
			// The row as the insert wrote it (SQLIntoClaimed), as a
			// claim's RETURNING would have read it back.
			jr := &JobRow{
				ID: id, Kind: row.Kind, Queue: row.Queue, State: StateClaimed, Priority: row.Priority,
				Attempt: 1, MaxAttempts: row.MaxAttempts, RunAt: at, CreatedAt: at, AttemptedAt: at,
				AttemptedBy: c.cfg.ID, EncodedArgs: row.Args, Metadata: row.Metadata, LeaseToken: l.Token,
			}
			if len(row.Tags) > 0 {
				jr.Tags = row.Tags
			}
			c.adopt(ctx, cl, jr, sent, notes)
		}
		return eager.Job[*JobRow]{ID: id, Row: cl.row, Execute: func(ctx context.Context) error { return c.execute(ctx, cl) }}
	}
	return l, nil
}

// Producer implements eager.Inserter: the client's tracer provider and
// relay.jobs.enqueued counter, as its own enqueues use them.
func (e eagerInserter) Producer() eager.Producer {
	return eager.Producer{TracerProvider: e.c.cfg.TracerProvider, Enqueued: e.c.metrics.enqueued}
}

// claimKnown claims queued job id (sqlClaimKnown) and makes it a claimed
// job of the client; cl.row is nil when nothing was claimed.
func (c *Client) claimKnown(ctx context.Context, q *queue, id int64, kind, queue string) (*claimedJob, error) {
	token := uuid.New()
	sent, notes := time.Now(), c.cancelNotes.Load()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// A claim committed must be answered, whatever the caller's context
	// does meanwhile (as the fetch loop's claims): only an already
	// cancelled caller is refused, and the round trip is bounded by time.
	bctx, bcancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer bcancel()
	rows, err := c.pool.Query(bctx, sqlClaimKnown, c.cfg.ID, leaseToken(token), c.cfg.LeaseDuration.Milliseconds(), kind, queue, id)
	if err != nil {
		return nil, fmt.Errorf("core: claim %s job %d: %w", kind, id, err)
	}
	claimed, err := scanClaimed(rows, c.cfg.ID)
	if err != nil {
		return nil, fmt.Errorf("core: claim %s job %d: %w", kind, id, err)
	}
	cl := &claimedJob{id: id, q: q}
	if len(claimed) == 0 {
		return cl, nil
	}
	c.adopt(ctx, cl, claimed[0], sent, notes)
	return cl, nil
}

// adopt makes jr, claimed by this client's statement sent at sent, a job in
// flight of the client, for cl's caller to execute. notes is cancelNotes
// when the statement was sent: a cancel notification of jr heard between
// the statement's commit and now found nothing in flight, and was dropped;
// if any was heard since (cancelNotes moved), the job is checked for a
// cancel (cancelCancelled), so that its handler learns of it at once, with
// ErrJobCancelled, not at its next heartbeat (as ErrLeaseLost). onNotify
// counts a notification before it looks for its job, and adopt stores the
// job before it reads the count: a notification either finds the job or
// is counted here.
func (c *Client) adopt(ctx context.Context, cl *claimedJob, jr *JobRow, sent time.Time, notes uint64) {
	c.stats.claimed.Add(1)
	// The handler's context carries the caller's values (its logger, its
	// span) but not its cancellation (see Execute): it ends with the
	// client's work context, a cancel or a lost lease.
	hctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(c.workCtx, func() { cancel(context.Cause(c.workCtx)) })
	r := &running{row: jr, ctx: hctx, cancel: func(cause error) { stop(); cancel(cause) }, attrs: c.metrics.with(jr)}
	jr.run = r
	c.startLease(r, sent)
	c.metrics.pickup.Record(ctx, jr.AttemptedAt.Sub(jr.CreatedAt).Seconds(), r.attrs)
	c.inflight.Store(jr.ID, r)
	cl.row, cl.r = jr, r
	if c.cancelNotes.Load() != notes {
		c.cancelCancelled(ctx, []int64{jr.ID})
	}
}

// execute runs a job claimed for an eager caller (eager.Job.Execute).
func (c *Client) execute(ctx context.Context, cl *claimedJob) error {
	if cl == nil || cl.r == nil {
		return eager.ErrNotClaimed
	}
	r, q := cl.r, cl.q
	cl.r = nil
	if ctx.Err() != nil {
		// Gone already: cancelled now, not by AfterFunc's goroutine,
		// which executeOne could outrun and start the handler.
		r.cancel(ErrCallerGone)
	}
	defer context.AfterFunc(ctx, func() { r.cancel(ErrCallerGone) })()
	err := q.executeOne(r)
	if !cl.lent {
		q.releaseSlot()
	}
	return err
}

// takeSlot reserves a worker slot for an eager job, counted as a claimed
// job of the queue (the fetch loop claims one fewer meanwhile) and of the
// client (Stop waits for it).
func (q *queue) takeSlot() error {
	c := q.client
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed || !c.live.Load():
		return fmt.Errorf("%w: the client is not running", eager.ErrUnavailable)
	case q.running >= q.max:
		return fmt.Errorf("%w: all %d worker slots of the queue are busy", eager.ErrUnavailable, q.max)
	}
	q.running++
	q.active.Add(1)
	c.jobs.Add(1) // under q.mu, before close: Stop's wait sees it
	return nil
}

// releaseSlot gives an eager job's slot to the oldest prefetched job, or
// frees it.
func (q *queue) releaseSlot() {
	q.mu.Lock()
	if len(q.waiting) > 0 {
		next := q.waiting[0]
		q.waiting = q.waiting[1:]
		q.mu.Unlock()
		go q.execute(next)
		return
	}
	q.running--
	q.mu.Unlock()
	if q.more.Load() {
		q.notify()
	}
}
