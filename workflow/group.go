package workflow

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/relayq/relay/internal/fence"
)

// Group commit of checkpoints: the fenced writes of executions that run at
// the same time in one process (each a pipelined batch of statements ending
// in its lease check, see batchWrite) are sent together as one batch, which
// PostgreSQL runs as one implicit transaction: one round trip, one commit
// and one WAL flush for all of them instead of one each. Each write still
// commits before its execution goes on, and only under its own lease.
//
// When the server refuses a statement of the group, the whole group rolls
// back, and is sent again without the member whose statement failed: that
// member gets its error when it was a lost lease (RLY02: it would fail
// alone too), and is sent alone otherwise. The group gives up on a row lock
// after groupLockTimeout (the member waiting for it is then sent alone,
// where waiting holds up no one else): so one member waiting on a caller's
// transaction (a Signal or Cancel holding its run's job row) does not stall
// the others, and a group cannot deadlock with a tree walk (Cancel locks a
// tree's run rows in its own order) for the second PostgreSQL takes to find
// the deadlock.
//
// Nothing waits to fill a group: a write is sent at once when fewer than
// groupSenders groups are in flight, and writes that arrive meanwhile go
// together in the next group. One execution at a time therefore pays
// nothing; a hundred pay one round trip per group instead of one each
// (docs/benchmarks.md, "Current figures: group commit and notifications
// after the commit").
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

// groupLockTimeout bounds a group's wait for any row lock.
const groupLockTimeout = "50ms"

const sqlGroupLockTimeout = `SELECT set_config('lock_timeout', '` + groupLockTimeout + `', true)`

// member is one write of a group: queue adds its statements to the batch;
// read reads exactly their results, in order, and returns the write's
// error. A member reads its results even after an error of its own (a row
// it did not find), so that the next member reads its own.
type member struct {
	job   int64 // the run's job: members lock their job rows in this order
	queue func(b *pgx.Batch)
	read  func(br pgx.BatchResults) error
}

type groupCall struct {
	ctx  context.Context // the caller's: bounds the member's sends alone
	m    member
	done chan error // buffered: answered once
}

// errGroupAbandoned answers a write whose group was not sent to its end
// (the sender panicked); whether it committed is unknown.
var errGroupAbandoned = errors.New("workflow: checkpoint group abandoned; outcome unknown")

// do sends m, with whatever other writes are waiting, and returns its
// error once its group committed (or failed). If ctx ends first, the write
// may still commit: do then returns ctx's error, as a lost connection
// would.
func (g *grouper) do(ctx context.Context, pool *pgxpool.Pool, m member) error {
	c := &groupCall{ctx: ctx, m: m, done: make(chan error, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, c)
	if g.senders < groupSenders {
		g.senders++
		calls := g.pending
		g.pending = nil
		g.mu.Unlock()
		func() {
			defer g.next(pool)
			sendGroup(pool, calls)
		}()
	} else {
		g.mu.Unlock()
	}
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("workflow: checkpoint: outcome unknown: %w", ctx.Err())
	}
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
		defer g.next(pool)
		sendGroup(pool, calls)
	}()
}

// sendGroup sends calls as one batch and answers each. The batch is bounded
// by writeTimeout, not by any one caller's context; a member sent alone is
// bounded by its caller's.
func sendGroup(pool *pgxpool.Pool, calls []*groupCall) {
	answered := 0
	defer func() {
		if answered < len(calls) {
			// Only a panic leaves calls unanswered: answer them, so that
			// their executions end, and let the panic go on.
			for _, c := range calls {
				select {
				case c.done <- errGroupAbandoned:
				default:
				}
			}
		}
	}()
	if len(calls) == 1 {
		calls[0].done <- sendAlone(calls[0].ctx, pool, calls[0].m)
		answered = 1
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	// Job rows are locked in one order (ascending id, as the core's batch
	// statements lock them), so two groups do not deadlock.
	slices.SortFunc(calls, func(a, b *groupCall) int { return cmp.Compare(a.m.job, b.m.job) })
	b := &pgx.Batch{}
	b.Queue(sqlGroupLockTimeout)
	for _, c := range calls {
		c.m.queue(b)
	}
	br := pool.SendBatch(ctx, b)
	errs := make([]error, len(calls))
	failed := -1 // the member whose statement the server refused
	_, err := br.Exec()
	if err == nil {
		for i, c := range calls {
			errs[i] = c.m.read(br)
			var pgErr *pgconn.PgError
			if errors.As(errs[i], &pgErr) {
				failed = i
				break
			}
		}
	}
	closeErr := br.Close()
	if err == nil {
		err = closeErr
	}
	var pgErr *pgconn.PgError
	var prep pgx.ErrPreprocessingBatch
	switch {
	case failed >= 0:
		// The server ended the implicit transaction: nothing of the
		// group is written. The failed member's lost lease is its
		// verdict; any other refusal (a lock it waited for too long)
		// is retried alone. The others go again, as a group.
		f := calls[failed]
		if fence.IsLost(errs[failed]) {
			f.done <- errs[failed]
		} else {
			go func() { f.done <- sendAlone(f.ctx, pool, f.m) }()
		}
		rest := slices.Delete(slices.Clone(calls), failed, failed+1)
		answered = len(calls)
		sendGroup(pool, rest)
		return
	case err != nil && (errors.As(err, &pgErr) || errors.As(err, &prep) || pgconn.SafeToRetry(err)):
		// Nothing was executed, or the server refused the batch (its
		// commit, or a statement no member read): each write alone.
		var wg sync.WaitGroup
		for _, c := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.done <- sendAlone(c.ctx, pool, c.m)
			}()
		}
		answered = len(calls)
		wg.Wait()
		return
	}
	for i, c := range calls {
		if errs[i] == nil {
			// The commit's outcome is every member's: a connection lost
			// after the batch was sent leaves it unknown to all. (So
			// does an error of pgx's own reading a member's results,
			// such as a value that does not scan, which pgx then
			// returns for every later result: the members after it
			// are told of an error although they committed, the
			// direction that loses no write.)
			errs[i] = closeErr
		}
		c.done <- errs[i]
	}
	answered = len(calls)
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
