package workflow

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Group commit of checkpoints: the fenced writes of executions that run at
// the same time in one process (each a pipelined batch of statements ending
// in its lease check, see batchWrite) are sent together as one batch, which
// PostgreSQL runs as one implicit transaction: one round trip, one commit
// and one WAL flush for all of them instead of one each. Each write still
// commits before its execution goes on, and only under its own lease: a
// lost lease (or any other error of the server) rolls the group back, and
// then every write of the group is sent again alone, so that each gets its
// own verdict and none is refused for another's.
//
// Nothing waits to fill a group: a write is sent at once when fewer than
// groupSenders groups are in flight, and writes that arrive meanwhile go
// together in the next group. One execution at a time therefore pays
// nothing; a hundred pay one round trip per group instead of one each
// (docs/benchmarks.md, "Group commit of checkpoints").
type grouper struct {
	mu      sync.Mutex
	pending []*groupCall
	senders int
}

// groupSenders is how many groups may be in flight at once (each holds a
// pool connection while it is). More than one, so that a group's commit
// (its WAL flush) and the next group's statements overlap, and so that the
// statements of many executions are not all run by one backend.
const groupSenders = 4

// member is one write of a group: queue adds its statements to the batch;
// read reads exactly their results, in order, and returns the write's
// error. A member reads its results even after an error of its own (a
// row it did not find), so that the next member reads its own.
type member struct {
	job   int64 // the run's job: members lock their job rows in this order
	queue func(b *pgx.Batch)
	read  func(br pgx.BatchResults) error
}

type groupCall struct {
	m    member
	done chan error
}

// do sends m, with whatever other writes are waiting, and returns its
// error once its group committed (or failed).
func (g *grouper) do(ctx context.Context, pool *pgxpool.Pool, m member) error {
	c := &groupCall{m: m, done: make(chan error, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, c)
	if g.senders >= groupSenders {
		g.mu.Unlock()
		return <-c.done
	}
	g.senders++
	calls := g.pending
	g.pending = nil
	g.mu.Unlock()
	sendGroup(ctx, pool, calls)
	g.next(pool)
	return <-c.done
}

// next sends the writes that arrived while a group was in flight, on a
// goroutine of its own (their executions are waiting), or frees the
// sender's place.
func (g *grouper) next(pool *pgxpool.Pool) {
	g.mu.Lock()
	if len(g.pending) == 0 {
		g.senders--
		g.mu.Unlock()
		return
	}
	calls := g.pending
	g.pending = nil
	g.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		defer cancel()
		sendGroup(ctx, pool, calls)
		g.next(pool)
	}()
}

// sendGroup sends calls as one batch and answers each.
func sendGroup(ctx context.Context, pool *pgxpool.Pool, calls []*groupCall) {
	if len(calls) == 1 {
		calls[0].done <- sendAlone(ctx, pool, calls[0].m)
		return
	}
	// Job rows are locked in one order (ascending id, as the core's batch
	// statements lock them), so two groups, or a group and a heartbeat,
	// do not deadlock.
	slices.SortFunc(calls, func(a, b *groupCall) int { return cmp.Compare(a.m.job, b.m.job) })
	b := &pgx.Batch{}
	for _, c := range calls {
		c.m.queue(b)
	}
	br := pool.SendBatch(ctx, b)
	errs := make([]error, len(calls))
	rolledBack := false
	for i, c := range calls {
		errs[i] = c.m.read(br)
		var pgErr *pgconn.PgError
		if errors.As(errs[i], &pgErr) {
			// The server ended the implicit transaction: nothing of
			// the group is written.
			rolledBack = true
			break
		}
	}
	closeErr := br.Close()
	var pgErr *pgconn.PgError
	if rolledBack || errors.As(closeErr, &pgErr) || (closeErr != nil && pgconn.SafeToRetry(closeErr)) {
		// Each write again, alone, for its own verdict.
		var wg sync.WaitGroup
		for _, c := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.done <- sendAlone(ctx, pool, c.m)
			}()
		}
		wg.Wait()
		return
	}
	for i, c := range calls {
		if errs[i] == nil {
			// The commit's outcome is every member's: a connection lost
			// after the batch was sent leaves it unknown to all.
			errs[i] = closeErr
		}
		c.done <- errs[i]
	}
}

// sendAlone sends m as a batch of its own.
func sendAlone(ctx context.Context, pool *pgxpool.Pool, m member) error {
	b := &pgx.Batch{}
	m.queue(b)
	br := pool.SendBatch(ctx, b)
	err := m.read(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}
