package core

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// outcomeKind says which fenced write ends an attempt.
type outcomeKind uint8

const (
	outcomeSuccess outcomeKind = iota // succeeded
	outcomeFailure                    // back to queued after a delay, or dead
	outcomeRelease                    // interrupted by a shutdown: queued at once, attempt not counted
)

// outcome is the end of one attempt, waiting to be written.
type outcome struct {
	row  *JobRow
	kind outcomeKind
	// lost: the attempt's lease loss was already counted (the handler was
	// cancelled with ErrLeaseLost, but returned a result anyway).
	lost bool
	// Failures only.
	state JobState      // queued or dead
	delay time.Duration // until the next attempt
	msg   string        // the error, as recorded
	log   *slog.Logger  // the attempt's logger
}

// completer records the ends of attempts in batches: one statement per kind
// of outcome (successes, failures, releases) for the outcomes gathered
// since the previous batch was taken. Under load that is one round trip
// for many jobs; a small batch waits up to completeGather for company,
// including the outcomes that arrived while the previous batch was written.
//
// It never waits on a row lock: each statement locks the rows it can with
// SKIP LOCKED and reports the rows another transaction holds (a caller's
// Cancel or long transaction). Those, and whole batches the database could
// not take, are written again after a pause; an outcome is dropped only
// when its lease is gone (the fence refused it) or Stop's deadline passes.
// An outcome waiting here, or being written, keeps its lease: the
// heartbeat renews it (see leased) until it is written or its lease is
// lost, so a slow or stalled write does not let the job be rescued and run
// again while its outcome is in memory.
type completer struct {
	c       *Client
	ctx     context.Context // cancelled when Stop gives up on what is pending
	cancel  context.CancelFunc
	mu      sync.Mutex
	pending []outcome
	// writing is the batch flush is writing (nil between batches).
	writing []outcome
	// urgent: pending holds an outcome that makes a job runnable (see
	// completeGather).
	urgent  bool
	signal  chan struct{}
	done    chan struct{}
	closing bool
	// quiet is how long a batch of plain successes waits for company:
	// completeGatherQuiet (tests lengthen it).
	quiet time.Duration
}

const completeBatchMax = 2000

// A small batch waits up to completeGather for more outcomes before it is
// written (a full one, completeGatherMin or more, goes at once): under a
// steady trickle of jobs this turns one UPDATE and one commit per job into
// one per few milliseconds, at the cost of recording each outcome that much
// later. The outcome is not visible in the table meanwhile; the job's lease
// covers it. A batch of plain successes, which make no other job runnable,
// waits up to completeGatherQuiet: at a steady 1,000 jobs/s that is a
// synchronous commit per 10 jobs instead of per 3. A batch holding an
// outcome that makes a job runnable (the success of a job with an
// ordering key, whose next job waits for it; a retry; a release) keeps
// the short wait.
const (
	completeGather      = 3 * time.Millisecond
	completeGatherQuiet = 10 * time.Millisecond
	completeGatherMin   = 100
)

func newCompleter(c *Client) *completer {
	ctx, cancel := context.WithCancel(context.Background())
	return &completer{c: c, ctx: ctx, cancel: cancel, signal: make(chan struct{}, 1), done: make(chan struct{}), quiet: completeGatherQuiet}
}

func (p *completer) add(o outcome) {
	p.mu.Lock()
	p.pending = append(p.pending, o)
	if o.kind != outcomeSuccess || o.row.OrderingKey != "" {
		p.urgent = true
	}
	p.mu.Unlock()
	p.wake()
}

func (p *completer) wake() {
	select {
	case p.signal <- struct{}{}:
	default:
	}
}

func (p *completer) run() {
	defer close(p.done)
	failures := 0
	for {
		select {
		case <-p.signal:
		case <-p.ctx.Done():
			return
		}
		p.gather()
		for {
			p.mu.Lock()
			batch := p.pending
			if len(batch) > completeBatchMax {
				batch = batch[:completeBatchMax:completeBatchMax]
				p.pending = p.pending[completeBatchMax:]
			} else {
				p.pending = nil
				p.urgent = false
			}
			p.writing = batch
			closing := p.closing
			p.mu.Unlock()
			if len(batch) == 0 {
				if closing {
					return
				}
				break
			}
			again, err := p.flush(batch)
			if len(again) == 0 {
				failures = 0
				// What arrived during the write waits for company as any
				// small batch does (its add signalled: gather runs next),
				// unless it is a full batch, holds an outcome that makes a
				// job runnable, or Stop is waiting. Written at once, it made
				// every other batch a small one under a steady load.
				p.mu.Lock()
				p.writing = nil
				next, urgent := len(p.pending), p.urgent || p.closing
				p.mu.Unlock()
				if next >= completeGatherMin || urgent {
					continue
				}
				break
			}
			// Put them back in front, and pause: the database is unreachable,
			// or another transaction holds their rows.
			p.mu.Lock()
			p.pending = append(again, p.pending...)
			p.writing = nil
			p.mu.Unlock()
			failures++
			wait := min(time.Duration(failures)*20*time.Millisecond, time.Second)
			if err != nil {
				wait = min(time.Duration(failures)*200*time.Millisecond, 5*time.Second)
				p.c.logger.Warn("relay: recording attempts' outcomes failed; retrying", "jobs", len(again), "error", err, "retry_in", wait)
			}
			select {
			case <-time.After(wait):
			case <-p.ctx.Done():
				return
			}
		}
	}
}

// leased appends to runs the attempts whose outcome is pending or being
// written and whose lease this client may still renew: not lost while the
// handler ran, and renewed within its local lease budget (see
// Client.heartbeat). An attempt whose outcome was written meanwhile may be
// among them; its renewal then finds no lease, which says nothing: the
// write's own fence tells whether the lease held.
func (p *completer) leased(runs []*running) []*running {
	c := p.c
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, os := range [2][]outcome{p.writing, p.pending} {
		for _, o := range os {
			if r := o.row.run; r != nil && !o.lost && !r.lost.Load() && !c.leasePassed(r) {
				runs = append(runs, r)
			}
		}
	}
	return runs
}

// gather waits, up to p.quiet (completeGather once an urgent outcome is
// pending), for a small batch to grow.
func (p *completer) gather() {
	start := time.Now()
	deadline := start.Add(p.quiet)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		n, closing, urgent := len(p.pending), p.closing, p.urgent
		p.mu.Unlock()
		if n >= completeGatherMin || closing {
			return
		}
		if urgent && start.Add(completeGather).Before(deadline) {
			deadline = start.Add(completeGather)
		}
		select {
		case <-p.signal:
		case <-time.After(time.Until(deadline)):
			return
		}
	}
}

// flush writes one batch, a statement per kind of outcome, and returns the
// outcomes to write again: those whose rows another transaction held, and
// every outcome of a statement that failed (with its error).
func (p *completer) flush(batch []outcome) (again []outcome, err error) {
	var byKind [3][]outcome
	for _, o := range batch {
		byKind[o.kind] = append(byKind[o.kind], o)
	}
	var wake []string
	for kind, os := range byKind {
		if len(os) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(p.ctx, 15*time.Second)
		written, werr := p.write(ctx, outcomeKind(kind), os)
		cancel()
		if werr != nil {
			again = append(again, os...)
			err = werr
			continue
		}
		for _, o := range os {
			switch w, held := written[o.row.ID]; {
			case !held:
				p.lost(o)
			case !w:
				again = append(again, o)
			default:
				if q := p.recorded(o); q != "" && !slices.Contains(wake, q) {
					wake = append(wake, q)
				}
			}
		}
	}
	p.c.notifyQueues(p.c.outcomes, wake)
	return again, err
}

// write runs the statement of kind for os. written maps each id whose
// attempt still holds its lease to whether the write was made (false: its
// row was locked by another transaction); an id missing has lost its lease.
func (p *completer) write(ctx context.Context, kind outcomeKind, os []outcome) (map[int64]bool, error) {
	ids := make([]int64, len(os))
	tokens := make([]pgtype.UUID, len(os))
	for i, o := range os {
		ids[i], tokens[i] = o.row.ID, leaseToken(o.row.LeaseToken)
	}
	sql, args := sqlCompleteMany, []any{ids, tokens}
	switch kind {
	case outcomeFailure:
		states := make([]string, len(os))
		delays := make([]int64, len(os))
		msgs := make([]string, len(os))
		for i, o := range os {
			states[i], delays[i], msgs[i] = string(o.state), o.delay.Microseconds(), o.msg
		}
		sql, args = sqlFailMany, append(args, states, delays, msgs)
	case outcomeRelease:
		sql = sqlReleaseMany
	}
	rows, err := p.c.outcomes.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return scanFenced(rows, len(os))
}

// scanFenced reads the result of a fenced batch write (see fencedWrite):
// each id whose attempt still holds its lease, to whether it was written.
// A result in the binary format (the default, extended protocol) is read
// from the wire, one map entry per row; else with Scan.
func scanFenced(rows pgx.Rows, n int) (map[int64]bool, error) {
	defer rows.Close()
	written := make(map[int64]bool, n)
	fds := rows.FieldDescriptions()
	wire := len(fds) == 2 && fds[0].DataTypeOID == pgtype.Int8OID && fds[0].Format == pgtype.BinaryFormatCode &&
		fds[1].DataTypeOID == pgtype.BoolOID && fds[1].Format == pgtype.BinaryFormatCode
	for rows.Next() {
		if vals := rows.RawValues(); wire && len(vals) == 2 && len(vals[1]) == 1 {
			if id, ok := int8Wire(vals[0]); ok {
				written[id] = vals[1][0] != 0
				continue
			}
		}
		var id int64
		var w bool
		if err := rows.Scan(&id, &w); err != nil {
			return nil, err
		}
		written[id] = w
	}
	return written, rows.Err()
}

// recorded counts a written outcome, and returns the queue to wake when the
// write made a job runnable now ("" for none).
func (p *completer) recorded(o outcome) string {
	c, r := p.c, o.row
	switch o.kind {
	case outcomeSuccess:
		c.stats.succeeded.Add(1)
		c.metrics.succeeded.Add(context.Background(), 1, c.metrics.of(r))
		if r.OrderingKey != "" {
			return r.Queue // the key's next job may run now
		}
	case outcomeFailure:
		if o.state == StateDead {
			c.stats.dead.Add(1)
			c.metrics.dead.Add(context.Background(), 1, c.metrics.of(r))
			o.log.Warn("relay: job failed and is dead", "error", o.msg)
			if r.OrderingKey != "" {
				return r.Queue
			}
			return ""
		}
		c.stats.retried.Add(1)
		c.metrics.retried.Add(context.Background(), 1, c.metrics.of(r))
		o.log.Warn("relay: job failed; will retry", "error", o.msg, "retry_in", o.delay)
		if o.delay <= 0 {
			return r.Queue
		}
	case outcomeRelease:
		c.stats.released.Add(1)
		return r.Queue
	}
	return ""
}

// lost counts an outcome the fence refused.
func (p *completer) lost(o outcome) {
	c, r := p.c, o.row
	if o.kind == outcomeRelease {
		return // released after its lease was gone: nothing was lost by it
	}
	if !o.lost {
		c.stats.leaseLost.Add(1)
		c.metrics.leaseLost.Add(context.Background(), 1, c.metrics.of(r))
	}
	what := "success"
	if o.kind == outcomeFailure {
		what = "failure"
	}
	c.logger.Warn("relay: "+what+" not recorded: lease lost (the job was rescued or cancelled meanwhile)",
		jobLogAttrs(r, "attempt", r.Attempt, "job_error", o.msg)...)
}

// stop writes what is pending and ends the completer, giving up when ctx is
// done. It returns how many outcomes it could not write.
func (p *completer) stop(ctx context.Context) int {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	p.wake()
	select {
	case <-p.done:
	case <-ctx.Done():
		p.cancel()
		<-p.done // its statements are bound to p.ctx: they return now
	}
	p.cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

// CompleteTx records the success of the running job inside tx, the handler's
// own transaction, so that the handler's database writes in tx and the job's
// success commit together or not at all: a database-only effect then happens
// exactly once, even across crashes. Call it last in tx, then commit, then
// return nil from Work.
//
// It returns ErrLeaseLost when the attempt no longer holds the job (its lease
// expired and it was rescued, or it was cancelled): roll tx back then, so the
// effect is not made twice. If tx does not commit, return an error from Work
// (or the job is retried only after its lease expires).
func CompleteTx[T JobArgs](ctx context.Context, tx DB, job *Job[T]) error {
	ex, err := execerFor(tx)
	if err != nil {
		return err
	}
	n, err := ex.Exec(ctx, sqlCompleteOne, job.ID, job.LeaseToken.String())
	if err != nil {
		return fmt.Errorf("core: complete job %d in transaction: %w", job.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("core: complete job %d in transaction: %w", job.ID, ErrLeaseLost)
	}
	job.completedInTx = true
	if job.run != nil {
		job.run.completedInTx.Store(true)
	}
	return nil
}
