package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// queue claims and runs the jobs of one named queue for a client.
type queue struct {
	client *Client
	name   string
	// spanName names its attempts' spans ("process " + name), made once.
	spanName string
	max      int
	// prefetch jobs may be claimed beyond max; they wait, in claim order,
	// for a running job to hand its slot over.
	prefetch int
	mu       sync.Mutex
	running  int        // jobs holding a slot (≤ max)
	waiting  []*running // prefetched jobs, oldest first
	// idle holds the inboxes of executor goroutines parked without a job,
	// the most recently parked last. A claimed job goes to one of them
	// rather than to a new goroutine: a fresh goroutine grows its stack
	// again on every job (a quarter of a no-op worker's CPU in a profile), a
	// parked one keeps it. At most max are parked; close ends them.
	idle   []chan *running
	closed bool
	// active counts claimed jobs of this client: running or waiting.
	active atomic.Int64
	// more is set when the last claim filled its limit: the queue probably
	// holds more runnable jobs, so a freed slot should fetch at once.
	more atomic.Bool
	// rescan asks the fetch loop to drop its cursor (see sqlClaimAfter): set
	// by every notification, since a new job may sort before it.
	rescan atomic.Bool
	wake   chan struct{}
	// limits says whether global limits apply to this queue (limits.go).
	limits limitState
	// floor bounds the claims' walk when VACUUM falls behind (claimfloor.go).
	floor claimFloor
	// floorClaims counts the jobs claimed since the floor's keeper last
	// measured the front of the claim index (floorCheckDue).
	floorClaims atomic.Int64
}

// claimCursor is a position in claim order: (priority, run_at, id).
type claimCursor struct {
	priority int
	runAt    time.Time
	id       int64
}

func (a claimCursor) less(b claimCursor) bool {
	if a.priority != b.priority {
		return a.priority < b.priority
	}
	if !a.runAt.Equal(b.runAt) {
		return a.runAt.Before(b.runAt)
	}
	return a.id < b.id
}

func (q *queue) notify() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// run is the queue's fetch loop: wait for a reason to look (a notification, a
// freed slot while more work is likely, or the poll tick), then claim as many
// jobs as there are free slots, in batches of at most FetchLimit.
func (q *queue) run(ctx, workCtx context.Context) {
	c := q.client
	poll := time.NewTicker(c.cfg.PollInterval)
	defer poll.Stop()
	failures := 0
	// While a drain takes full batches, each claim starts after the last
	// job of the previous one; a notification or the poll starts over.
	var cursor *claimCursor
	// When the last claim was sent (ClaimCoalesce counts from it).
	var lastClaim time.Time
	// Look for work at once: jobs enqueued while no client ran notified
	// nobody, and the listener may take a while to connect.
	q.notify()
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.wake:
		case <-poll.C:
			cursor = nil
		}
		if !q.coalesce(ctx, lastClaim) {
			return
		}
		if q.rescan.Swap(false) {
			cursor = nil
		}
		// front: a short claim from a drain's cursor is followed by one
		// from the front, at once: the cursor's claim stops at the end of
		// its priority's due range (walkClaimStatement), and the queued
		// jobs of the priorities after it notify nobody again.
		front := false
		for ctx.Err() == nil {
			free := q.max + q.prefetch - int(q.active.Load())
			if free <= 0 {
				break
			}
			limit := min(free, c.cfg.FetchLimit)
			// Not ctx: a claim cancelled mid-flight may have committed, leaving
			// jobs claimed with no handler until their leases expire.
			claimCtx, cancel := c.dbCtx()
			// The lease runs, at the earliest, from the moment the claim
			// is sent: the local lease deadline counts from here.
			sent := time.Now()
			lastClaim = sent
			fromCursor := cursor != nil
			rows, err := q.claim(claimCtx, limit, cursor)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				failures++
				wait := min(time.Duration(failures)*100*time.Millisecond, 5*time.Second)
				c.logger.Warn("relay: claim failed", "queue", q.name, "error", err, "retry_in", wait)
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
				continue
			}
			failures = 0
			q.floorClaims.Add(int64(len(rows)))
			q.more.Store(len(rows) == limit)
			cursor = nil
			if len(rows) == limit {
				cursor = &claimCursor{rows[0].Priority, rows[0].RunAt, rows[0].ID}
				for _, r := range rows[1:] {
					if p := (claimCursor{r.Priority, r.RunAt, r.ID}); cursor.less(p) {
						cursor = &p
					}
				}
			}
			// One timer watches the local lease deadlines of the claim's
			// jobs (lease.go).
			leases := c.newLeaseGroup(sent, len(rows))
			for _, row := range rows {
				q.active.Add(1)
				c.jobs.Add(1)
				// The context is made now so that a cancel or a lost lease
				// reaches a prefetched job too; heartbeats cover it from here.
				ctx, cancel := context.WithCancelCause(workCtx)
				r := &running{row: row, ctx: ctx, cancel: cancel, attrs: c.metrics.with(row)}
				row.run = r
				leases.add(r, sent)
				pickup := row.AttemptedAt.Sub(row.RunAt)
				if row.CreatedAt.After(row.RunAt) {
					pickup = row.AttemptedAt.Sub(row.CreatedAt)
				}
				c.metrics.pickup.Record(ctx, pickup.Seconds(), r.attrs)
				c.inflight.Store(row.ID, r)
				q.mu.Lock()
				if q.closed {
					// Stop got here first: the job must not start.
					q.mu.Unlock()
					r.cancel(ErrShutdown)
					q.finish(r)
					continue
				}
				if q.running < q.max {
					q.running++
					var inbox chan *running
					if n := len(q.idle); n > 0 {
						inbox = q.idle[n-1]
						q.idle = q.idle[:n-1]
					}
					q.mu.Unlock()
					if inbox != nil {
						inbox <- r // buffered: never blocks
					} else {
						go q.execute(r)
					}
				} else {
					q.waiting = append(q.waiting, r)
					q.mu.Unlock()
				}
			}
			leases.seal()
			if len(rows) < limit {
				if fromCursor && !front {
					front = true // cursor is nil: the next claim is from the front
					continue
				}
				break
			}
		}
	}
}

// coalesce waits, before a claim, until ClaimCoalesce has passed since the
// last claim was sent (see Config.ClaimCoalesce), unless the queue is
// draining a backlog (the last claim took all it asked for). A wake-up
// that arrives meanwhile is taken with it: the claim that follows covers
// it. It returns false when ctx ended.
func (q *queue) coalesce(ctx context.Context, lastClaim time.Time) bool {
	wait := q.client.cfg.ClaimCoalesce - time.Since(lastClaim)
	if wait <= 0 || q.more.Load() {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	select {
	case <-q.wake:
	default:
	}
	return true
}

func (q *queue) claim(ctx context.Context, limit int, after *claimCursor) ([]*JobRow, error) {
	c := q.client
	if q.limits.apply(ctx, c, q.name) {
		return q.claimLimited(ctx, limit)
	}
	sql, args := sqlClaim, []any{q.name, limit, c.cfg.LeaseDuration.Milliseconds(), c.cfg.ID, leaseToken(uuid.New())}
	if c.cfg.SynchronousClaims {
		sql = sqlClaimSync
	}
	switch f, ok := q.floor.get(); {
	case ok && (after == nil || after.less(f)):
		// From the floor (claimfloor.go), over every priority after it.
		sql, args = sqlClaimFrom, append(args, int16(f.priority), f.runAt, f.id)
		if c.cfg.SynchronousClaims {
			sql = sqlClaimFromSync
		}
	case after != nil:
		// A drain's next claim: the rest of its priority's due range.
		sql, args = walkClaimSQL(c.cfg.SynchronousClaims, limit), append(args, int16(after.priority), after.runAt, after.id)
	}
	rows, err := c.own.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	out, err := scanClaimed(rows, c.cfg.ID)
	if err != nil {
		return nil, err
	}
	c.stats.claimed.Add(int64(len(out)))
	return out, nil
}

// execute is an executor goroutine: it runs a claimed job holding a slot,
// then the prefetched jobs waiting for that slot, oldest first (the handover
// costs no scheduling), then parks until the fetch loop hands it another
// job or the queue closes.
//
// Its whole life runs above a frame of parkPad bytes. The GC halves a
// goroutine's stack when less than a quarter of it is in use; a parked
// executor uses almost none, so every GC would shrink it and its next job
// would grow it again, copying the stack each time (about a quarter of a
// no-op worker's CPU in a profile). With the padding in use, stacks up to
// 4×parkPad keep their size. The padding is zeroed once, here, not at
// every park (zeroing 8 KB per job was 5% of a no-op worker's CPU). The
// price: an executor holds at least a 16 KB stack (32 MB for 2,000
// workers), and its handlers run parkPad deeper. Figures in
// docs/benchmarks.md ("Worker-side waste found by profiling").
func (q *queue) execute(r *running) {
	var pad [parkPad]byte
	q.executeLoop(r)
	padSink(pad[:])
}

// parkPad is the stack an executor keeps in use while parked (see execute).
const parkPad = 8 << 10

//go:noinline
func padSink([]byte) {}

// executeLoop is execute's loop, above its padding.
//
//go:noinline
func (q *queue) executeLoop(r *running) {
	inbox := make(chan *running, 1)
	for {
		q.executeOne(r)
		next, parked := q.handOver(inbox)
		switch {
		case next != nil:
			r = next
		case !parked:
			return
		default:
			var ok bool
			if r, ok = <-inbox; !ok {
				return
			}
		}
	}
}

// handOver gives the finished job's slot to the oldest waiting job, or frees
// it and parks the executor's inbox on the idle list.
func (q *queue) handOver(inbox chan *running) (next *running, parked bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiting) > 0 {
		next = q.waiting[0]
		q.waiting = q.waiting[1:]
		return next, false
	}
	q.running--
	if q.closed {
		return nil, false
	}
	q.idle = append(q.idle, inbox)
	return nil, true
}

// close ends the parked executors, and makes the busy ones end after their
// jobs. Call it once the fetch loop has returned: nothing is handed out
// after.
func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	for _, inbox := range q.idle {
		close(inbox)
	}
	q.idle = nil
	// Prefetched jobs never started: a graceful stop gives them back now
	// rather than running them.
	waiting := q.waiting
	q.waiting = nil
	q.mu.Unlock()
	for _, r := range waiting {
		r.cancel(ErrShutdown)
		q.finish(r)
	}
}

// finish ends a claimed job that will not run (a prefetched job at a stop,
// or one whose context ended before it started). Only a shutdown has a
// lease to give back; a cancelled job or a lost lease has none.
func (q *queue) finish(r *running) {
	c := q.client
	c.endLease(r)
	c.inflight.CompareAndDelete(r.row.ID, r)
	if returnedUncounted(context.Cause(r.ctx)) {
		c.completer.add(outcome{row: r.row, kind: outcomeRelease})
	}
	r.cancel(nil)
	q.active.Add(-1)
	c.jobs.Done()
}

// executeOne runs one job and records its outcome. It returns the
// handler's error, or why the handler did not run.
func (q *queue) executeOne(r *running) error {
	c, row, ctx := q.client, r.row, r.ctx
	if ctx.Err() != nil {
		// Cancelled, lease lost or shutting down before it started (a
		// prefetched job): nothing ran.
		err := context.Cause(ctx)
		q.finish(r)
		return err
	}
	if c.leasePassed(r) {
		// The claim's answer came too late (a partition healed, say): the
		// lease may be gone already, so the handler must not start.
		c.loseLease(r, "claimed after its local lease deadline")
		q.finish(r)
		return ErrLeaseLost
	}
	defer func() {
		c.endLease(r)
		r.cancel(nil)
		q.active.Add(-1)
		c.jobs.Done()
		if q.more.Load() {
			q.notify()
		}
	}()

	// The attempt's span; the handler's spans nest under it.
	spanCtx, span := c.startAttemptSpan(ctx, row, q.spanName)
	attrs := r.attrs
	if attrs == nil {
		attrs = c.metrics.with(row)
	}
	c.metrics.started.Add(ctx, 1, attrs)
	began := time.Now()
	reg := c.workers[row.Kind]
	var err error
	if row.undecodable != nil {
		err = Permanent(row.undecodable)
	} else if reg == nil {
		err = fmt.Errorf("%w %q in this process (registered: %v)", ErrUnknownKind, row.Kind, c.cfg.Workers.Kinds())
	} else {
		err = runHandler(spanCtx, reg, row)
	}
	// The handler is over: its local lease deadline is disarmed before it
	// leaves the jobs in flight, so that a heartbeat renewing it meanwhile
	// cannot re-arm it (a "lease lost" 24 s later for a job long done).
	c.endLease(r)
	c.inflight.CompareAndDelete(row.ID, r) // not a newer attempt of the same job
	c.metrics.duration.Record(ctx, time.Since(began).Seconds(), attrs)
	if err == nil { // the hot path: nothing to log, nothing to allocate
		endAttemptSpan(span, nil, StateSucceeded, 0)
		if r.completedInTx.Load() {
			c.stats.succeeded.Add(1)
			c.metrics.succeeded.Add(context.Background(), 1, attrs)
			if row.OrderingKey != "" {
				c.notifyQueues(c.own, []string{row.Queue})
			}
		} else {
			// Even after a lost lease: the fence tells whether it still
			// holds (a lease that only missed its local deadline may).
			c.completer.add(outcome{row: row, kind: outcomeSuccess, lost: r.lost.Load()})
		}
		return nil
	}
	cause := context.Cause(ctx)
	// The attempt's logger, made only by the branches that log (a snooze,
	// a workflow run's every suspension, does not).
	logger := func() *slog.Logger {
		log := c.logger.With(jobLogAttrs(row, "queue", row.Queue, "attempt", row.Attempt)...)
		if sc := span.SpanContext(); sc.IsValid() {
			log = log.With("trace_id", sc.TraceID().String(), "span_id", sc.SpanID().String())
		}
		return log
	}

	switch {
	case errors.Is(cause, ErrLeaseLost):
		logger().Warn("relay: job lost its lease while running; its result is not recorded", "error", err)
		endAttemptSpan(span, fmt.Errorf("%w: %w", ErrLeaseLost, err), StateClaimed, 0)
	case errors.Is(cause, ErrJobCancelled):
		logger().Info("relay: running job was cancelled", "error", err)
		c.metrics.cancelled.Add(context.Background(), 1, attrs)
		endAttemptSpan(span, fmt.Errorf("%w: %w", ErrJobCancelled, err), StateCancelled, 0)
	case returnedUncounted(cause):
		c.completer.add(outcome{row: row, kind: outcomeRelease})
		endAttemptSpan(span, fmt.Errorf("%w: %w", cause, err), StateQueued, 0)
	case isSnooze(err):
		q.snoozed(row, span, err)
	default:
		if ctx.Err() != nil && cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
		state, delay := c.fail(logger(), reg, row, err)
		endAttemptSpan(span, err, state, delay)
	}
	return err
}

// runHandler calls the worker with the job's timeout, turning a panic into
// an error that carries its stack.
//
// When the timeout ended the attempt, the error names it: the handler
// usually returns just ctx.Err() ("context deadline exceeded"), and the
// cause lives on the context made here, which the caller never sees.
func runHandler(ctx context.Context, reg *registration, row *JobRow) (err error) {
	if reg.timeout != nil {
		if d := reg.timeout(row); d > 0 {
			timeout := fmt.Errorf("core: job timed out after %s", d)
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeoutCause(ctx, d, timeout)
			defer cancel()
			defer func() {
				if err != nil && context.Cause(ctx) == timeout && !errors.Is(err, timeout) {
					err = fmt.Errorf("%w: %w", timeout, err)
				}
			}()
		}
	}
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return reg.work(ctx, row)
}

// fail hands a failed attempt to the completer: retry after a delay, or
// dead. It returns what it asked for; the completer logs and counts the
// outcome once it is written.
func (c *Client) fail(log *slog.Logger, reg *registration, row *JobRow, err error) (JobState, time.Duration) {
	state, delay := StateQueued, time.Duration(0)
	var perm *permanentError
	var rin *retryInError
	switch {
	case errors.As(err, &perm), row.Attempt >= row.MaxAttempts:
		state = StateDead
	case errors.As(err, &rin):
		delay = rin.delay
	default:
		delay = c.retryDelay(reg, row.Attempt, err)
	}
	msg := truncate(sanitizeText(err.Error()), 8<<10)
	c.completer.add(outcome{row: row, kind: outcomeFailure, state: state, delay: delay, msg: msg, log: log})
	return state, delay
}

// retryDelay is how long a job of reg's kind (nil: a kind this process
// does not know) waits after attempt failed with err: its kind's
// RetryPolicy, else the client's.
func (c *Client) retryDelay(reg *registration, attempt int, err error) time.Duration {
	if reg != nil && reg.retry != nil {
		return reg.retry.RetryDelay(attempt, err)
	}
	return c.cfg.RetryPolicy.RetryDelay(attempt, err)
}

// releaseAll releases every job still in flight (handlers that ignored their
// cancelled context), fencing out their eventual writes.
func (c *Client) releaseAll() {
	c.inflight.Range(func(k, v any) bool {
		r := v.(*running)
		c.inflight.Delete(k)
		c.endLease(r)
		c.completer.add(outcome{row: r.row, kind: outcomeRelease})
		return true
	})
}

// idsAndTokens lists rows' ids and lease tokens for a batch statement.
func idsAndTokens(rows []*JobRow) ([]int64, []pgtype.UUID) {
	ids := make([]int64, len(rows))
	tokens := make([]pgtype.UUID, len(rows))
	for i, r := range rows {
		ids[i], tokens[i] = r.ID, leaseToken(r.LeaseToken)
	}
	return ids, tokens
}

// leaseToken is a lease token as a statement's argument. pgtype.UUID, not
// uuid.UUID (pgx tries, and fails with a formatted error, another plan for
// it first: 6% of a burn-down worker's CPU) nor [16]byte (which pgx cannot
// send in the exec and simple-protocol modes a transaction-pooling
// PgBouncer needs, having no type for it without the server's description).
func leaseToken(t [16]byte) pgtype.UUID { return pgtype.UUID{Bytes: t, Valid: true} }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…(truncated)"
}

// notifyQueues wakes the workers of every process serving queues: jobs
// there have just become runnable (the next job of an ordering key,
// released jobs, retries without delay), and nothing else would tell them
// before the next poll.
//
// The completer sends it on the client's own pool; an executor (after a
// CompleteTx) on the caller's, since the client's pool has one connection
// for the completer and none for executors.
func (c *Client) notifyQueues(db *pgxpool.Pool, queues []string) {
	if len(queues) == 0 {
		return
	}
	list, _ := json.Marshal(queues)
	ctx, cancel := c.dbCtx()
	defer cancel()
	if _, err := db.Exec(ctx, sqlNotifyQueues, string(list)); err != nil {
		c.logger.Warn("relay: could not wake the workers of queues with runnable jobs; they will poll", "queues", queues, "error", err)
	}
}
