package workflow

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
	"github.com/relayq/relay/internal/fence"
)

// Checkpoints: every write an execution makes, fenced by the run job's
// lease.

// write runs fn in a transaction that commits only while the execution's
// attempt holds the run's lease. The first write of an execution also marks
// the run started and learns of a cancel; due sleeps are marked completed.
func (x *execution) write(fn func(ctx context.Context, tx pgx.Tx) error) error {
	return x.writeTx(fn, true)
}

// writeTx is write; hold false leaves the fence to fn (which completes the
// job with core.CompleteTx, itself fenced by the lease token).
//
// The execution's own bookkeeping goes first, in one round trip (a batch):
// the run's touch or cancel check, due sleeps, a state change, and the
// deferred checkpoints (see later).
func (x *execution) writeTx(fn func(ctx context.Context, tx pgx.Tx) error, hold bool) error {
	x.endDryRun()
	cancel, err := x.runWrite(x.bookkeeping(), func(ctx context.Context, tx pgx.Tx, cancel bool) error {
		x.cancelRead = cancel
		return fn(ctx, tx)
	}, hold)
	return x.wrote(cancel, err)
}

// bookkeeping is the first batch of a write's transaction: the server's
// bound on the transaction and the execution's own writes
// (queueBookkeeping). It reads the execution's state, so it is built on
// the execution's goroutine.
func (x *execution) bookkeeping() *pgx.Batch {
	b := &pgx.Batch{}
	// The server's bound on this transaction, as the write's context is
	// the client's: a worker cut off after fence.Hold (before its COMMIT
	// arrives) would otherwise keep the run's job row locked, and its
	// rescue waiting, until the server noticed the dead connection (hours,
	// with default TCP keepalives).
	b.Queue(sqlBoundIdleTx, strconv.FormatInt(writeTimeout.Milliseconds(), 10))
	x.queueBookkeeping(b, true)
	return b
}

// runWrite runs a write's transaction: the bookkeeping batch b, then fn
// (given the cancel flag as b read it), then (given hold) fence.Hold,
// and returns the run's cancel flag. It changes nothing of the
// execution's state (wrote does, after it), so a step attempt with a
// timeout runs it on a goroutine of its own.
func (x *execution) runWrite(b *pgx.Batch, fn func(ctx context.Context, tx pgx.Tx, cancel bool) error, hold bool) (cancel bool, err error) {
	wctx, cancelWrite := context.WithTimeout(context.WithoutCancel(x.ctx), writeTimeout)
	defer cancelWrite()
	err = pgx.BeginFunc(wctx, x.r.pool, func(tx pgx.Tx) error {
		br := tx.SendBatch(wctx, b)
		if _, err := br.Exec(); err != nil {
			br.Close()
			return fmt.Errorf("bound the transaction: %w", err)
		}
		if err := br.QueryRow().Scan(&cancel); err != nil {
			br.Close()
			return fmt.Errorf("touch run: %w", err)
		}
		for i := 2; i < b.Len(); i++ {
			if _, err := br.Exec(); err != nil {
				br.Close()
				return fmt.Errorf("write deferred checkpoints: %w", err)
			}
		}
		if err := br.Close(); err != nil {
			return err
		}
		if err := fn(wctx, tx, cancel); err != nil {
			return err
		}
		if !hold {
			return nil
		}
		// Last, so the job row is locked only for the commit.
		return fence.Hold(wctx, dbx.PGX{Q: tx}, x.job.ID, x.job.LeaseToken)
	})
	if err != nil && errors.Is(err, core.ErrLeaseLost) {
		x.r.stats.refused.Add(1)
		x.r.logger.Warn("relay: workflow checkpoint refused: the execution lost the run's lease", "run_id", x.runID, "job_id", x.job.ID)
	}
	return cancel, err
}

// wrote applies a committed write (runWrite) to the execution's state:
// its bookkeeping is written, and a cancel it read is seen.
func (x *execution) wrote(cancel bool, err error) error {
	if err != nil {
		return err
	}
	x.touched, x.dueWaits, x.setState, x.pending = true, nil, "", nil
	x.cancelling = x.cancelling || cancel
	x.r.stats.checkpoints.Add(1)
	return nil
}

// queueBookkeeping queues the execution's own writes in b, first of every
// write: the run's touch (the first write of the execution) or a read of
// its cancel flag (when readCancel), the due sleeps, a state change and the
// deferred checkpoints.
func (x *execution) queueBookkeeping(b *pgx.Batch, readCancel bool) {
	if readCancel {
		q := sqlCancelRequested
		if !x.touched {
			q = sqlTouchRun
		}
		b.Queue(q, x.runID)
	}
	if len(x.dueWaits) > 0 {
		b.Queue(sqlCompleteWaits, x.runID, x.dueWaits)
	}
	if x.setState != "" {
		b.Queue(sqlSetRunState, x.runID, string(x.setState))
	}
	for _, s := range x.pending {
		b.Queue(sqlUpsertStep, (&stepWrite{row: s, attempts: 1, delay: -1}).args(x.runID)...)
	}
}

// writeTimeout bounds one of an execution's writes.
const writeTimeout = 30 * time.Second

// outcome is a run's end, for batchWrite.
type outcome struct {
	state  RunState
	output any // the encoded output (string) or nil
	msg    string
	// retryFrom is the run's retry_from (an int, or nil).
	retryFrom any
}

// batchWrite is write without a function of the caller's, in one round
// trip: the bookkeeping, the deferred checkpoints, given fin the run's
// outcome, and the lease check are one pipelined batch, which PostgreSQL
// runs as one implicit transaction: all of it commits under the lease, or
// none of it. When the batch ends in a checkpoint, the lease check and the
// cancel read are that checkpoint's statement (sqlUpsertStepFenced);
// otherwise the batch ends in a statement of its own (fence.Check). It is
// sent with the batches of other executions writing at the same moment
// (grouper).
func (x *execution) batchWrite(fin *outcome, extra ...*stepWrite) error {
	return x.batchWriteOp(fin, nil, extra...)
}

// batchOp is one statement of a write's own in batchWrite's batch (a
// child's start): queue adds exactly one, read reads its result.
type batchOp struct {
	queue func(b *pgx.Batch)
	read  func(br pgx.BatchResults) error
}

// batchWriteOp is batchWrite with op's statement after the checkpoints,
// before the outcome and the lease check.
func (x *execution) batchWriteOp(fin *outcome, op *batchOp, extra ...*stepWrite) error {
	x.endDryRun()
	ctx, cancelWrite := context.WithTimeout(context.WithoutCancel(x.ctx), writeTimeout)
	defer cancelWrite()
	var steps [][]any
	for _, s := range x.pending {
		steps = append(steps, (&stepWrite{row: s, attempts: 1, delay: -1}).args(x.runID))
	}
	for _, w := range extra {
		steps = append(steps, w.args(x.runID))
	}
	// folded: the last checkpoint carries the lease check and the cancel
	// read. Not with op, whose statement (a child's start) comes after
	// the checkpoints.
	folded := op == nil && len(steps) > 0
	b := &pgx.Batch{}
	// The cancel flag matters to an execution that goes on; the outcome's
	// batch reads it only as part of the first write's touch.
	readCancel := fin == nil || !x.touched
	// finTouches: the execution's first write is its outcome (a run
	// whose steps' checkpoints all waited for its end), which then marks
	// the run started itself (sqlFinishRootRun, sqlFinishChildRun), in the
	// same update of its row: no touch, and no cancel read, which the
	// execution no longer acts on (the outcome refuses a completion a
	// cancel wins over). The batch is one transaction, so no other
	// session ever sees the run between the touch and the outcome: only
	// the row's second update is saved. Not with a state change
	// (compensating comes from running).
	finTouches := fin != nil && !x.touched && x.setState == "" &&
		(fin.state == StateCompleted || fin.state == StateFailed)
	cancelAt := -1
	switch {
	case finTouches:
	case !x.touched:
		cancelAt = b.Len()
		b.Queue(sqlTouchRun, x.runID)
	case readCancel && !folded:
		cancelAt = b.Len()
		b.Queue(sqlCancelRequested, x.runID)
	}
	if len(x.dueWaits) > 0 {
		b.Queue(sqlCompleteWaits, x.runID, x.dueWaits)
	}
	if x.setState != "" {
		b.Queue(sqlSetRunState, x.runID, string(x.setState))
	}
	finAt := -1
	queueFin := func() {
		finAt = b.Len()
		touch := 0
		if finTouches {
			touch = 1
		}
		if x.run.parentID == "" {
			b.Queue(sqlFinishRootRun, x.runID, string(fin.state), fin.output, fin.msg, fin.retryFrom, touch)
		} else {
			// And wakes the parent, unless it waits for this in its slot.
			job, token := x.lender()
			b.Queue(sqlFinishChildRun, x.runID, string(fin.state), fin.output, fin.msg, fin.retryFrom, job, token, touch)
		}
	}
	if fin != nil && folded {
		// Before the last checkpoint, which locks the job's row: rows are
		// locked in one order everywhere (the run's row, then its job's),
		// which Cancel and Signal follow too, so no two writers deadlock.
		queueFin()
	}
	fencedAt := -1
	for i, args := range steps {
		if folded && i == len(steps)-1 {
			fencedAt = b.Len()
			b.Queue(sqlUpsertStepFenced, append(args, x.job.ID, x.job.LeaseToken.String())...)
			continue
		}
		b.Queue(sqlUpsertStep, args...)
	}
	opAt := -1
	if op != nil {
		opAt = b.Len()
		op.queue(b)
	}
	if fin != nil && !folded {
		queueFin()
	}
	if !folded {
		// Last, for the same lock order.
		sql, args := fence.Check(x.job.ID, x.job.LeaseToken)
		b.Queue(sql, args...)
	}
	cancel, refused, finWrote := false, false, false
	err := x.r.group.do(ctx, x.r.pool, member{
		job: x.job.ID,
		queue: func(g *pgx.Batch) {
			for _, q := range b.QueuedQueries {
				g.Queue(q.SQL, q.Arguments...)
			}
		},
		read: func(br pgx.BatchResults) error {
			var err error
			keep := func(e error) {
				if err == nil {
					err = e
				}
			}
			cancel, refused, finWrote = false, false, false
			for i := range b.Len() {
				switch i {
				case cancelAt:
					var c bool
					keep(br.QueryRow().Scan(&c))
					cancel = cancel || c
				case opAt:
					keep(op.read(br))
				case fencedAt:
					var wakeAt *time.Time
					var c bool
					keep(br.QueryRow().Scan(&wakeAt, &c))
					cancel = cancel || (readCancel && c)
				default:
					ct, e := br.Exec()
					keep(e)
					if i == finAt {
						if e == nil && ct.RowsAffected() == 0 && cancelRefuses(fin.state) {
							refused = true // a cancel is requested (sqlFinishRootRun)
						}
						finWrote = e == nil && ct.RowsAffected() == 1
					}
				}
			}
			return err
		},
	})
	if err != nil {
		if fence.IsLost(err) {
			x.r.stats.refused.Add(1)
			x.r.logger.Warn("relay: workflow checkpoint refused: the execution lost the run's lease", "run_id", x.runID, "job_id", x.job.ID)
			return fmt.Errorf("%w: %w", core.ErrLeaseLost, err)
		}
		return err
	}
	x.touched, x.dueWaits, x.setState, x.pending = true, nil, "", nil
	if finTouches && !finWrote {
		// The outcome, refused (a cancel won), did not mark the run
		// started: the execution's next write does.
		x.touched = false
	}
	for _, w := range extra {
		w.row.attempts += w.attempts
		x.hist[w.row.position] = w.row
	}
	x.cancelling = x.cancelling || cancel || refused
	x.finWrote = finWrote
	x.r.stats.checkpoints.Add(1)
	if refused {
		return errCancelWins
	}
	return nil
}

// stepWrite is a checkpoint written by batchWrite: row, attempts to add,
// and its wake-up (wakeAt, or delay from the database's now() when delay is
// not negative; neither for none).
type stepWrite struct {
	row      *stepRow
	attempts int
	wakeAt   *time.Time
	delay    time.Duration
}

func (w *stepWrite) args(runID string) []any {
	s := w.row
	var out any
	if s.output != "" {
		out = s.output
	}
	var delayUS *int64
	if w.wakeAt == nil && w.delay >= 0 {
		us := w.delay.Microseconds()
		delayUS = &us
	}
	return []any{runID, s.position, s.key, s.kind, s.state, out, s.errMsg, w.attempts, w.wakeAt, delayUS, s.childID, s.attempt.encode(), s.errInfo, s.startedAt}
}

// record is batchWrite of checkpoints for the execution's own bookkeeping:
// any failure ends the execution, as fenced.
func (x *execution) record(writes ...*stepWrite) {
	if err := x.batchWrite(nil, writes...); err != nil {
		x.writeFailed(err)
	}
}

// writeFailed ends the execution after a failed write of its own: a lost
// lease records nothing more; any other failure is the execution's (the
// core retries the run).
func (x *execution) writeFailed(err error) {
	if errors.Is(err, core.ErrLeaseLost) {
		x.stop(&unwind{kind: unwindLost, err: err})
	}
	x.stop(&unwind{kind: unwindAbort, err: fmt.Errorf("workflow: run %s: checkpoint: %w", x.runID, err)})
}

// later defers the checkpoint of a completed step (or recorded value) to
// the execution's next write: nothing outside the function has seen its
// output before then, because that write comes before the next step's fn
// runs (flush), with the next StepTx, child start, wait or suspension, or
// with the run's outcome. A run of n inline steps thus commits n-1
// checkpoints plus its outcome, not n plus its outcome. If the execution
// dies first, the step runs again, as any step whose checkpoint did not
// commit.
func (x *execution) later(s *stepRow) {
	s.attempts++
	x.hist[s.position] = s
	x.pending = append(x.pending, s)
}

// flush commits the deferred checkpoints now: before a step's fn runs,
// since its effects may depend on their outputs.
func (x *execution) flush() {
	if len(x.pending) == 0 {
		return
	}
	if err := x.batchWrite(nil); err != nil {
		x.writeFailed(err)
	}
}

// settleBookkeeping writes the execution's own bookkeeping (the run's
// touch, due sleeps, a state change, deferred checkpoints) now, if it has
// any, so that the next transaction carries none of it.
func (x *execution) settleBookkeeping() {
	if x.touched && len(x.pending) == 0 && len(x.dueWaits) == 0 && x.setState == "" {
		return
	}
	if err := x.batchWrite(nil); err != nil {
		x.writeFailed(err)
	}
}

// fenced is write for the execution's own bookkeeping: any failure ends
// the execution (a lost lease records nothing more).
func (x *execution) fenced(fn func(ctx context.Context, tx pgx.Tx) error) {
	if err := x.write(fn); err != nil {
		x.writeFailed(err)
	}
}

// upsert writes the checkpoint s in tx and returns its wake_at.
func (x *execution) upsert(ctx context.Context, tx pgx.Tx, s *stepRow, attempts int, wakeAt *time.Time, delay time.Duration) (*time.Time, error) {
	var out any
	if s.output != "" {
		out = s.output
	}
	var at *time.Time
	var delayUS *int64
	if wakeAt == nil && (s.state == stepWaiting || s.state == stepRetrying) && delay >= 0 {
		us := delay.Microseconds()
		delayUS = &us
	}
	err := tx.QueryRow(ctx, sqlUpsertStep, x.runID, s.position, s.key, s.kind, s.state, out, s.errMsg,
		attempts, wakeAt, delayUS, s.childID, s.attempt.encode(), s.errInfo, s.startedAt).Scan(&at)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s %q at %d: %w", s.kind, s.key, s.position, err)
	}
	s.wakeAt = at
	s.attempts += attempts
	x.hist[s.position] = s
	return at, nil
}
