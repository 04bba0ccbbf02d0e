package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/relayq/relay/internal/dbx"
)

// queue claims and runs the jobs of one named queue for a client.
type queue struct {
	client *Client
	name   string
	max    int
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
		if q.rescan.Swap(false) {
			cursor = nil
		}
		for ctx.Err() == nil {
			free := q.max + q.prefetch - int(q.active.Load())
			if free <= 0 {
				break
			}
			limit := min(free, c.cfg.FetchLimit)
			// Not ctx: a claim cancelled mid-flight may have committed, leaving
			// jobs claimed with no handler until their leases expire.
			claimCtx, cancel := dbCtx()
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
			for _, row := range rows {
				q.active.Add(1)
				c.jobs.Add(1)
				// The context is made now so that a cancel or a lost lease
				// reaches a prefetched job too; heartbeats cover it from here.
				ctx, cancel := context.WithCancelCause(workCtx)
				r := &running{row: row, ctx: ctx, cancel: cancel}
				pickup := row.AttemptedAt.Sub(row.RunAt)
				if row.CreatedAt.After(row.RunAt) {
					pickup = row.AttemptedAt.Sub(row.CreatedAt)
				}
				c.metrics.pickup.Record(ctx, pickup.Seconds(), c.metrics.with(row))
				c.inflight.Store(row.ID, r)
				q.mu.Lock()
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
			if len(rows) < limit {
				break
			}
		}
	}
}

func (q *queue) claim(ctx context.Context, limit int, after *claimCursor) ([]*JobRow, error) {
	c := q.client
	sql, args := sqlClaim, []any{q.name, limit, c.cfg.LeaseDuration.Milliseconds(), c.cfg.ID, [16]byte(uuid.New())}
	if after != nil {
		sql, args = sqlClaimAfter, append(args, int16(after.priority), after.runAt, after.id)
	}
	rows, err := c.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	defer rows.Close()
	var out []*JobRow
	for rows.Next() {
		r := &JobRow{State: StateClaimed, AttemptedBy: c.cfg.ID}
		var token uuid.UUID
		var prio int16
		var args, meta []byte // raw: scanning jsonb into json.RawMessage re-parses it
		if err := rows.Scan(&r.ID, &r.Kind, &r.Queue, &prio, &r.Attempt, &r.MaxAttempts, &r.RunAt,
			&r.CreatedAt, &r.AttemptedAt, &args, &meta, &token, &r.OrderingKey); err != nil {
			return nil, fmt.Errorf("claim: scan: %w", err)
		}
		r.Priority = int(prio)
		r.LeaseToken = token
		r.EncodedArgs, r.Metadata = args, meta
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	c.stats.claimed.Add(int64(len(out)))
	return out, nil
}

// execute is an executor goroutine: it runs a claimed job holding a slot,
// then the prefetched jobs waiting for that slot, oldest first (the handover
// costs no scheduling), then parks until the fetch loop hands it another
// job or the queue closes.
func (q *queue) execute(r *running) {
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
			if r, ok = park(inbox); !ok {
				return
			}
		}
	}
}

// parkPad is the stack an executor keeps in use while parked.
const parkPad = 8 << 10

// park waits for the executor's next job inside a frame of parkPad bytes.
// The GC halves a goroutine's stack when less than a quarter of it is in
// use; a parked executor uses almost none, so every GC would shrink it and
// its next job would grow it again, copying the stack each time (about a
// quarter of a no-op worker's CPU in a profile). With the padding in use,
// stacks up to 4×parkPad keep their size. The price: a parked executor holds
// at least a 16 KB stack (32 MB for 2,000 workers). relay bench --jobs
// 300000 --workers 2000: worker CPU 22 → 12 µs per job, 28k → 35–37k jobs/s.
//
//go:noinline
func park(inbox chan *running) (*running, bool) {
	var pad [parkPad]byte
	r, ok := <-inbox
	padSink(pad[:])
	return r, ok
}

//go:noinline
func padSink([]byte) {}

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
	defer q.mu.Unlock()
	q.closed = true
	for _, inbox := range q.idle {
		close(inbox)
	}
	q.idle = nil
}

// executeOne runs one job and records its outcome.
func (q *queue) executeOne(r *running) {
	c, row, ctx := q.client, r.row, r.ctx
	defer func() {
		r.cancel(nil)
		q.active.Add(-1)
		c.jobs.Done()
		if q.more.Load() {
			q.notify()
		}
	}()
	if ctx.Err() != nil {
		// Cancelled, lease lost or shutting down before it started (a
		// prefetched job): nothing ran. Only a shutdown has a lease to give
		// back.
		c.inflight.CompareAndDelete(row.ID, r)
		if errors.Is(context.Cause(ctx), ErrShutdown) {
			c.release([]*JobRow{row})
		}
		return
	}

	// The attempt's span; the handler's spans nest under it.
	spanCtx, span := c.startAttemptSpan(ctx, row)
	attrs := c.metrics.with(row)
	c.metrics.started.Add(ctx, 1, attrs)
	began := time.Now()
	reg := c.workers[row.Kind]
	var err error
	if reg == nil {
		err = fmt.Errorf("%w %q in this process (registered: %v)", ErrUnknownKind, row.Kind, c.cfg.Workers.Kinds())
	} else {
		err = runHandler(spanCtx, reg, row)
	}
	c.inflight.CompareAndDelete(row.ID, r) // not a newer attempt of the same job
	c.metrics.duration.Record(ctx, time.Since(began).Seconds(), attrs)
	if err == nil { // the hot path: nothing to log, nothing to allocate
		endAttemptSpan(span, nil, StateSucceeded, 0)
		if row.completedInTx {
			c.stats.succeeded.Add(1)
			c.metrics.succeeded.Add(context.Background(), 1, attrs)
			c.wakeSuccessors([]*JobRow{row})
		} else {
			c.completer.add(row)
		}
		return
	}
	cause := context.Cause(ctx)
	log := c.logger.With("job_id", row.ID, "kind", row.Kind, "queue", row.Queue, "attempt", row.Attempt)
	if sc := span.SpanContext(); sc.IsValid() {
		log = log.With("trace_id", sc.TraceID().String(), "span_id", sc.SpanID().String())
	}

	switch {
	case errors.Is(cause, ErrLeaseLost):
		log.Warn("relay: job lost its lease while running; its result is not recorded", "error", err)
		c.metrics.leaseLost.Add(context.Background(), 1, attrs)
		endAttemptSpan(span, fmt.Errorf("%w: %w", ErrLeaseLost, err), StateClaimed, 0)
	case errors.Is(cause, ErrJobCancelled):
		log.Info("relay: running job was cancelled", "error", err)
		c.metrics.cancelled.Add(context.Background(), 1, attrs)
		endAttemptSpan(span, fmt.Errorf("%w: %w", ErrJobCancelled, err), StateCancelled, 0)
	case errors.Is(cause, ErrShutdown):
		c.release([]*JobRow{row})
		endAttemptSpan(span, fmt.Errorf("%w: %w", ErrShutdown, err), StateQueued, 0)
	case isSnooze(err):
		q.snoozed(row, span, err)
	default:
		if ctx.Err() != nil && cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
		state, delay := c.fail(log, reg, row, err)
		endAttemptSpan(span, err, state, delay)
	}
}

// runHandler calls the worker with the job's timeout, turning a panic into
// an error that carries its stack.
func runHandler(ctx context.Context, reg *registration, row *JobRow) (err error) {
	if reg.timeout != nil {
		if d := reg.timeout(row); d > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeoutCause(ctx, d, fmt.Errorf("core: job timed out after %s", d))
			defer cancel()
		}
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("core: worker panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return reg.work(ctx, row)
}

// fail records a failed attempt: retry after a delay, or dead.
func (c *Client) fail(log interface {
	Warn(string, ...any)
	Error(string, ...any)
}, reg *registration, row *JobRow, err error) (JobState, time.Duration) {
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
	msg := truncate(err.Error(), 8<<10)
	ctx, cancel := dbCtx()
	defer cancel()
	n, dbErr := dbx.PGX{Q: c.pool}.Exec(ctx, sqlFail, row.ID, row.LeaseToken, string(state), delay.Microseconds(), msg)
	switch {
	case dbErr != nil:
		log.Error("relay: could not record failed attempt; the lease will expire and the job will be rescued", "error", dbErr, "job_error", msg)
	case n == 0:
		c.stats.leaseLost.Add(1)
		c.metrics.leaseLost.Add(ctx, 1, c.metrics.with(row))
		log.Warn("relay: failure not recorded: lease lost", "job_error", msg)
	case state == StateDead:
		c.stats.dead.Add(1)
		c.metrics.dead.Add(ctx, 1, c.metrics.with(row))
		log.Warn("relay: job failed and is dead", "error", msg)
	default:
		c.stats.retried.Add(1)
		c.metrics.retried.Add(ctx, 1, c.metrics.with(row))
		log.Warn("relay: job failed; will retry", "error", msg, "retry_in", delay)
	}
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

// release returns interrupted attempts to the queue.
func (c *Client) release(rows []*JobRow) {
	if len(rows) == 0 {
		return
	}
	ids, tokens := idsAndTokens(rows)
	ctx, cancel := dbCtx()
	defer cancel()
	n, err := dbx.PGX{Q: c.pool}.Exec(ctx, sqlRelease, ids, tokens)
	if err != nil {
		c.logger.Error("relay: could not release interrupted jobs; their leases will expire", "jobs", len(rows), "error", err)
		return
	}
	c.stats.released.Add(n)
}

// releaseAll releases every job still in flight (handlers that ignored their
// cancelled context), fencing out their eventual writes.
func (c *Client) releaseAll() {
	var rows []*JobRow
	c.inflight.Range(func(k, v any) bool {
		rows = append(rows, v.(*running).row)
		c.inflight.Delete(k)
		return true
	})
	c.release(rows)
}

// idsAndTokens lists rows' ids and lease tokens for a batch statement. The
// tokens go as [16]byte, which pgx encodes as uuid directly (uuid.UUID made
// it try, and fail with a formatted error, another plan first: 6% of a
// burn-down worker's CPU).
func idsAndTokens(rows []*JobRow) ([]int64, [][16]byte) {
	ids := make([]int64, len(rows))
	tokens := make([][16]byte, len(rows))
	for i, r := range rows {
		ids[i], tokens[i] = r.ID, r.LeaseToken
	}
	return ids, tokens
}

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

// wakeSuccessors wakes the workers of every process after jobs with an
// ordering key finished: the next job of each key has just become
// claimable, and nothing else would tell them before the next poll.
func (c *Client) wakeSuccessors(rows []*JobRow) {
	var queues []string
	for _, r := range rows {
		if r.OrderingKey != "" && !slices.Contains(queues, r.Queue) {
			queues = append(queues, r.Queue)
		}
	}
	if len(queues) == 0 {
		return
	}
	list, _ := json.Marshal(queues)
	ctx, cancel := dbCtx()
	defer cancel()
	if _, err := c.pool.Exec(ctx, sqlNotifyQueues, string(list)); err != nil {
		c.logger.Warn("relay: could not wake the workers of ordered jobs' queues; they will poll", "error", err)
	}
}
