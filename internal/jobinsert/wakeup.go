package jobinsert

import (
	"context"
	"database/sql"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/uptrace/bun"

	"github.com/relayq/relay/internal/dbx"
)

// DefaultWakeWindow is the shortest time between two wake-ups that
// enqueues on one pool send for one queue (SQLNotifyQueues, after their
// commits). An enqueue that commits sooner after the last wake-up leaves
// its wake-up to one sent when the interval has passed, which covers every
// enqueue of the queue committed meanwhile; an enqueue after a quiet spell
// wakes the workers at once. Each wake-up costs a statement, and a delivery
// to every listening client, each of which then claims: at a steady 1,000
// single enqueues a second this halves those, for at most this much more
// pickup latency (docs/benchmarks.md, "Steady load: PostgreSQL CPU per
// job"). Like Config.ClaimCoalesce, which bounds the claims the wake-ups
// trigger.
//
// A deferred wake-up is sent by a timer of this process, so a producer
// that exits within the window of an enqueue that deferred its wake-up
// drops it (a Client's Stop sends its pool's first: Config.
// EnqueueWakeCoalesce): that job is still stored, and is picked up at the
// workers' next poll (Config.PollInterval) unless another wake-up of its
// queue comes first. Making such an enqueue wait and send the wake-up
// itself would close that gap, but would cap a producer that enqueues one
// job after another at one enqueue per DefaultWakeWindow (1,000/s), a
// worse price than a rare pickup delay.
const DefaultWakeWindow = time.Millisecond

// wakeKey names a pool's wake-ups of one queue.
type wakeKey struct {
	db    any // a pool: *pgxpool.Pool, *sql.DB or *bun.DB
	queue string
}

// wakeState is when a pool last woke a queue's workers, and whether a
// wake-up is scheduled and not yet sent (then timer sends it at due).
type wakeState struct {
	last    time.Time
	window  time.Duration // the last caller's, for pruning
	pending bool
	due     time.Time
	timer   *time.Timer
}

// wakeups holds the state of every pool that enqueued lately.
var wakeups = struct {
	mu     sync.Mutex
	m      map[wakeKey]*wakeState
	pruned time.Time // the last prune
}{m: map[wakeKey]*wakeState{}}

// wakeupsPruneAt is the number of states above which idle ones are
// dropped, at most once per wakeupsPruneEvery (the scan holds the lock
// every enqueue on a pool takes).
const wakeupsPruneAt = 256

const wakeupsPruneEvery = 100 * time.Millisecond

// Wake wakes the workers of queues after an insert on db (ex is db's
// execer) committed, coalescing wake-ups sent on a pool over window
// (DefaultWakeWindow, or a core Client's Config.EnqueueWakeCoalesce): every queue gets a wake-up sent
// after this commit, now or within window of the pool's last wake-up of
// it. A wake-up scheduled by a caller with a longer window is brought
// forward to this caller's bound. On a connection (which the caller may
// use again at once, and which is not safe for concurrent use) it is sent
// now. A failure loses nothing: the jobs are stored, and workers poll.
func Wake(ctx context.Context, db any, ex dbx.Execer, queues []string, window time.Duration) {
	if !isPool(db) {
		sendWakeups(ctx, ex, queues)
		return
	}
	now := time.Now()
	var send []string
	wakeups.mu.Lock()
	if len(wakeups.m) > wakeupsPruneAt && now.Sub(wakeups.pruned) >= wakeupsPruneEvery {
		wakeups.pruned = now
		for k, s := range wakeups.m {
			if !s.pending && now.Sub(s.last) >= s.window {
				delete(wakeups.m, k)
			}
		}
	}
	for _, q := range queues {
		k := wakeKey{db: db, queue: q}
		s := wakeups.m[k]
		if s == nil {
			s = &wakeState{}
			wakeups.m[k] = s
		}
		s.window = window
		want := s.last.Add(window)
		switch {
		case s.pending:
			// Scheduled and not sent yet: it will be sent after this
			// commit, at s.due, or sooner if this caller's window says so.
			// (A timer that cannot be stopped is firing: it waits for the
			// lock, then sends.)
			if want.Before(s.due) && s.timer.Stop() {
				if want.After(now) {
					s.due = want
					s.timer.Reset(want.Sub(now))
				} else {
					s.pending = false
					s.last = now
					send = append(send, q)
				}
			}
		case !want.After(now):
			s.last = now
			send = append(send, q)
		default:
			s.pending = true
			s.due = want
			s.timer = time.AfterFunc(want.Sub(now), func() {
				wakeups.mu.Lock()
				s.pending = false
				s.last = time.Now()
				wakeups.mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				sendWakeups(ctx, ex, []string{k.queue})
			})
		}
	}
	wakeups.mu.Unlock()
	sendWakeups(ctx, ex, send)
}

// FlushWakeups sends at once a wake-up of every queue with one scheduled
// for enqueues on db (a Client's Stop: a process that exits within a
// window would drop them, and their jobs would wait for the workers' next
// poll). The scheduled ones stay scheduled: if this send fails, or the
// process goes on, they are sent as before (a second wake-up costs a
// claim, a lost one a poll interval).
func FlushWakeups(ctx context.Context, db any, ex dbx.Execer) {
	var send []string
	wakeups.mu.Lock()
	for k, s := range wakeups.m {
		if k.db == db && s.pending {
			send = append(send, k.queue)
		}
	}
	wakeups.mu.Unlock()
	sendWakeups(ctx, ex, send)
}

// isPool says whether db is a pool: safe to use later, from another
// goroutine.
func isPool(db any) bool {
	switch db.(type) {
	case *pgxpool.Pool, *sql.DB, *bun.DB:
		return true
	}
	return false
}

// sendWakeups notifies the workers of queues, in a transaction of its own.
func sendWakeups(ctx context.Context, ex dbx.Execer, queues []string) {
	if len(queues) == 0 {
		return
	}
	list, _ := json.Marshal(queues)
	ex.Exec(ctx, SQLNotifyQueues, string(list)) //nolint:errcheck
}

// Scheduled reports the wake-up state of queue on pool db: the window its
// last caller coalesced over, and how long until a scheduled wake-up is
// sent (0 when none is scheduled). For tests of the callers' windows.
func Scheduled(db any, queue string) (window, left time.Duration) {
	wakeups.mu.Lock()
	defer wakeups.mu.Unlock()
	s := wakeups.m[wakeKey{db: db, queue: queue}]
	if s == nil {
		return 0, 0
	}
	if s.pending {
		left = time.Until(s.due)
	}
	return s.window, left
}

// QueuesToWake lists, once each, the queues of the rows inserted (those
// for which inserted says so) that are runnable now: the queues whose
// workers an insert wakes after its commit.
func QueuesToWake(rows []Row, inserted func(i int) bool) []string {
	now := time.Now()
	var queues []string
	for i, r := range rows {
		if !inserted(i) || !r.RunsNow(now) || slices.Contains(queues, r.Queue) {
			continue
		}
		queues = append(queues, r.Queue)
	}
	return queues
}
