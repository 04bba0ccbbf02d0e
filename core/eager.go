package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
)

// Eager execution: a caller inserts a job already claimed by a Client and
// runs it in its own goroutine, with no queue hop (no NOTIFY, no claim, no
// hand-over to an executor). The workflow layer's eager start
// (workflow.Run) is built on it, after Temporal's Eager Workflow Start.
//
// From the moment its claim commits the job is a claimed job of the client
// like any other: it holds one of its queue's worker slots, its lease is
// renewed by the client's heartbeats, a cancel or a lost lease cancels its
// handler, Stop waits for it (and interrupts it at its deadline), its
// outcome is fenced by its lease token, and if the process dies the lease
// expires and the rescuer puts it back in the queue for any worker.

var (
	// ErrEagerUnavailable: the client cannot take an eager job now (no free
	// worker slot on the queue, or the client is not running: not started,
	// or stopping). Nothing was written; enqueue the job instead.
	ErrEagerUnavailable = errors.New("core: eager execution unavailable")
	// ErrNotWorked: the client does not serve the job's queue or has no
	// worker for its kind, so it cannot claim the job. Nothing was written.
	ErrNotWorked = errors.New("core: this client does not work that queue or kind")
	// ErrCallerGone is the cause of an eager job's handler cancellation
	// when the context given to Execute ends: the attempt is returned to
	// the queue without being counted, as at a shutdown, and any worker
	// continues the job.
	ErrCallerGone = errors.New("core: the caller executing the job stopped waiting")
	// ErrNotClaimed: Execute was given a job that InsertClaimed left queued
	// (a paused queue or a global limit), or one already executed.
	ErrNotClaimed = errors.New("core: the job is not claimed by this caller")
)

// givenBack reports whether an attempt cancelled with cause goes back to
// the queue without being counted: a shutdown, or an eager caller gone.
func givenBack(cause error) bool {
	return errors.Is(cause, ErrShutdown) || errors.Is(cause, ErrCallerGone)
}

// WithJob is more work for InsertClaimed's round trip and transaction: the
// statements Queue adds run after the job's insert (InsertedJobID names
// its id in their SQL) and before its claim, and Read reads their results
// in order. An error of any of them rolls everything back.
type WithJob struct {
	Queue func(b *pgx.Batch)
	Read  func(br pgx.BatchResults) error
}

// Claimed is a job InsertClaimed inserted. Hand it to Execute.
type Claimed struct {
	// ID is the job's id.
	ID int64
	// Row is the claimed attempt, nil when the job was left queued (its
	// queue is paused or a global limit applies to it): it then waits for
	// a worker like any enqueued job, and the queue's workers were woken.
	Row *JobRow
	q   *queue
	r   *running
}

// InsertClaimed inserts a job of args already claimed by c, for the
// caller to run with Execute in its own goroutine: state claimed, attempt
// 1, a fresh lease token, c's LeaseDuration, attempted_by c.ID(), in one
// round trip and one transaction on c's pool (with the work of with, if
// any). The job takes one of the worker slots of its queue in c (counted
// in the queue's MaxWorkers) from now until Execute returns; call Execute
// exactly once, whatever happens in between.
//
// It refuses, writing nothing, a queue c does not serve or a kind it has
// no worker for (ErrNotWorked), and returns ErrEagerUnavailable when c is
// not running or the queue has no free slot: enqueue the job then. A job
// of a paused queue, or one a global limit applies to, is inserted queued
// (Claimed.Row is nil), not claimed. Ordering keys, unique jobs and a
// delay or run-at in the future are for enqueued jobs; they are refused.
func (c *Client) InsertClaimed(ctx context.Context, args JobArgs, opts *EnqueueOpts, with *WithJob) (*Claimed, error) {
	row, err := prepareEnqueue(args, opts)
	if err != nil {
		return nil, err
	}
	if row.OrderingKey != nil || row.UniqueKey != nil || row.DelayUS > 0 || (row.RunAt != nil && row.RunAt.After(time.Now())) {
		return nil, &ValidationError{Field: "opts", Reason: "an eager job takes no ordering key, unique key, delay or future run-at"}
	}
	q := c.queues[row.Queue]
	if q == nil || c.workers[row.Kind] == nil {
		return nil, fmt.Errorf("core: insert claimed %s job on queue %q: %w", row.Kind, row.Queue, ErrNotWorked)
	}
	if err := q.takeSlot(); err != nil {
		return nil, fmt.Errorf("core: insert claimed %s job on queue %q: %w", row.Kind, row.Queue, err)
	}
	cl, err := c.insertClaimed(ctx, q, row, with)
	if err != nil || cl.Row == nil {
		q.active.Add(-1)
		c.jobs.Done()
		q.releaseSlot()
	}
	return cl, err
}

func (c *Client) insertClaimed(ctx context.Context, q *queue, row enqueueRow, with *WithJob) (*Claimed, error) {
	ctx, span, tc := startEnqueueSpan(ctx, c.cfg.TracerProvider, row.Queue, 1)
	defer span.End()
	fail := func(err error) (*Claimed, error) {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return nil, fmt.Errorf("core: insert claimed %s job: %w", row.Kind, err)
	}
	var err error
	if tc != nil {
		if row.Metadata, err = withTraceMetadata(row.Metadata, tc); err != nil {
			return fail(err)
		}
	}
	token := uuid.New()
	b := &pgx.Batch{}
	b.Queue(sqlEnqueueNotifyAfter, string(appendBatch(nil, []enqueueRow{row})))
	if with != nil && with.Queue != nil {
		with.Queue(b)
	}
	b.Queue(sqlClaimInserted, c.cfg.ID, [16]byte(token), c.cfg.LeaseDuration.Milliseconds(), row.Kind, row.Queue)
	// The lease runs, at the earliest, from now: the local deadline counts
	// from here, as for a claim.
	sent := time.Now()
	// The batch commits a job claimed by this client: sent under the
	// caller's context, a cancellation between its COMMIT and the reply
	// would report a failure for a job committed claimed, with no handler
	// until its lease expired (the fetch loop's claims avoid this the same
	// way). Only an already cancelled caller is refused; the round trip
	// itself is bounded by time, as the client's own statements are.
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	bctx, bcancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer bcancel()
	br := c.pool.SendBatch(bctx, b)
	cl := &Claimed{q: q}
	var dup bool
	if err := br.QueryRow().Scan(&cl.ID, &dup); err != nil {
		br.Close()
		return fail(err)
	}
	if with != nil && with.Read != nil {
		if err := with.Read(br); err != nil {
			br.Close()
			return fail(err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return fail(err)
	}
	claimed, err := scanClaimed(rows, c.cfg.ID)
	if err == nil {
		err = br.Close() // the implicit transaction commits here
	} else {
		br.Close()
	}
	if err != nil {
		return fail(err)
	}
	countEnqueued(ctx, c.metrics.enqueued, []enqueueRow{row}, []EnqueueResult{{ID: cl.ID}})
	if len(claimed) == 0 {
		// Left queued (a paused queue, a limit): wake the workers, as an
		// enqueue would have.
		c.notifyQueues(c.pool, []string{row.Queue})
		return cl, nil
	}
	jr := claimed[0]
	c.stats.claimed.Add(1)
	// The handler's context carries the caller's values (its logger, its
	// span) but not its cancellation (see Execute): it ends with the
	// client's work context, a cancel or a lost lease.
	hctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(c.workCtx, func() { cancel(context.Cause(c.workCtx)) })
	r := &running{row: jr, ctx: hctx, cancel: func(cause error) { stop(); cancel(cause) }}
	jr.run = r
	c.startLease(r, sent)
	c.metrics.pickup.Record(ctx, jr.AttemptedAt.Sub(jr.CreatedAt).Seconds(), c.metrics.with(jr))
	c.inflight.Store(jr.ID, r)
	cl.Row, cl.r = jr, r
	return cl, nil
}

// Execute runs a job InsertClaimed claimed, in the caller's goroutine,
// through the client's normal worker path: the kind's worker with the
// Workers' middleware, its Timeout and RetryPolicy, the attempt's span and
// metrics, and the outcome recorded under the lease fence (success,
// failure with retry or dead, Snooze). It returns the handler's error (nil
// on success; a Snooze's error when the job went back to the queue), or why
// the handler did not run.
//
// ctx bounds the caller's wait, not the job's life: when it ends before
// the handler returns, the handler is cancelled with ErrCallerGone and the
// attempt goes back to the queue uncounted, for any worker to continue.
// The handler's context is cancelled, as a claimed job's, by a cancel, a
// lost lease and Stop's deadline.
func (c *Client) Execute(ctx context.Context, cl *Claimed) error {
	if cl == nil || cl.r == nil {
		return ErrNotClaimed
	}
	r, q := cl.r, cl.q
	cl.r = nil
	defer context.AfterFunc(ctx, func() { r.cancel(ErrCallerGone) })()
	err := q.executeOne(r)
	q.releaseSlot()
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
		return fmt.Errorf("%w: the client is not running", ErrEagerUnavailable)
	case q.running >= q.max:
		return fmt.Errorf("%w: all %d worker slots of the queue are busy", ErrEagerUnavailable, q.max)
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
