package core

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// completer records successes in batches: one UPDATE for every success that
// arrived while the previous one ran. Under load that is one round trip for
// many jobs; when idle, a success is written at once (no timer adds delay).
// A success waiting here is at most milliseconds old; if the process dies
// first, the job runs again (the at-least-once window, slightly widened).
type completer struct {
	c       *Client
	mu      sync.Mutex
	pending []*JobRow
	signal  chan struct{}
	done    chan struct{}
	closing bool
}

const completeBatchMax = 2000

// A small batch waits up to completeGather for more successes before it is
// written (a full one, completeGatherMin or more, goes at once): under a
// steady trickle of jobs this turns one UPDATE and one commit per job into
// one per few milliseconds, at the cost of recording each success that much
// later. The success is not visible in the table meanwhile; the job's lease
// covers it.
const (
	completeGather    = 3 * time.Millisecond
	completeGatherMin = 100
)

func newCompleter(c *Client) *completer {
	return &completer{c: c, signal: make(chan struct{}, 1), done: make(chan struct{})}
}

func (p *completer) add(row *JobRow) {
	p.mu.Lock()
	p.pending = append(p.pending, row)
	p.mu.Unlock()
	select {
	case p.signal <- struct{}{}:
	default:
	}
}

func (p *completer) run() {
	defer close(p.done)
	for range p.signal {
		p.gather()
		for {
			p.mu.Lock()
			batch := p.pending
			if len(batch) > completeBatchMax {
				batch = batch[:completeBatchMax]
				p.pending = p.pending[completeBatchMax:]
			} else {
				p.pending = nil
			}
			closing := p.closing
			p.mu.Unlock()
			if len(batch) == 0 {
				if closing {
					return
				}
				break
			}
			p.flush(batch)
		}
	}
}

// gather waits, up to completeGather, for a small batch to grow.
func (p *completer) gather() {
	deadline := time.Now().Add(completeGather)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		n, closing := len(p.pending), p.closing
		p.mu.Unlock()
		if n >= completeGatherMin || closing {
			return
		}
		select {
		case <-p.signal:
		case <-time.After(time.Until(deadline)):
			return
		}
	}
}

// flush writes one batch, retrying while the database is unreachable: a
// success not recorded means the job runs again, so it is worth waiting for.
func (p *completer) flush(batch []*JobRow) {
	ids, tokens := idsAndTokens(batch)
	for try := 1; ; try++ {
		ctx, cancel := dbCtx()
		recorded, err := p.write(ctx, ids, tokens)
		cancel()
		if err == nil {
			p.c.stats.succeeded.Add(int64(len(recorded)))
			var ordered []*JobRow
			for _, r := range batch {
				if _, ok := recorded[r.ID]; ok {
					p.c.metrics.succeeded.Add(context.Background(), 1, p.c.metrics.with(r))
					if r.OrderingKey != "" {
						ordered = append(ordered, r)
					}
				}
			}
			p.c.wakeSuccessors(ordered)
			if len(recorded) < len(batch) {
				for _, r := range batch {
					if _, ok := recorded[r.ID]; !ok {
						p.c.stats.leaseLost.Add(1)
						p.c.logger.Warn("relay: success not recorded: lease lost (the job was rescued or cancelled meanwhile)",
							"job_id", r.ID, "kind", r.Kind, "attempt", r.Attempt)
					}
				}
			}
			return
		}
		if try >= 10 {
			p.c.logger.Error("relay: could not record successes; their leases will expire and the jobs run again", "jobs", len(batch), "error", err)
			return
		}
		p.c.logger.Warn("relay: recording successes failed; retrying", "jobs", len(batch), "error", err)
		time.Sleep(time.Duration(try) * 200 * time.Millisecond)
	}
}

func (p *completer) write(ctx context.Context, ids []int64, tokens any) (map[int64]struct{}, error) {
	rows, err := p.c.pool.Query(ctx, sqlCompleteMany, ids, tokens)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	done := make(map[int64]struct{}, len(ids))
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		done[id] = struct{}{}
	}
	return done, rows.Err()
}

// stop flushes what is pending and ends the completer.
func (p *completer) stop() {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	select {
	case p.signal <- struct{}{}:
	default:
	}
	<-p.done
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
	return nil
}
