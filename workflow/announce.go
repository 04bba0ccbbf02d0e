package workflow

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// announcer tells Result callers that runs finished, and UpdateResult
// callers that updates were answered: one notification per run on channel
// relay_workflow (payload the run id) and per update on channel
// relay_workflow_update (payload the update's id), sent after the
// transaction that recorded the run's end or the update's answer
// committed, in a transaction of their own.
//
// Not in the outcome's transaction, because PostgreSQL serialises the
// commits of transactions that NOTIFY: it holds a database-wide lock from a
// notifying transaction's pre-commit until its WAL flush, so runs finishing
// together would commit one WAL flush after another (the queued drain of
// docs/benchmarks.md waited on that lock more than on anything else). A
// transaction that only notifies writes no WAL that must be flushed, so it
// holds that lock for microseconds.
//
// Runs and updates that end while a notification is being sent share the
// next statement; no goroutine runs while there is nothing to send. A
// notification lost to a crash between the commit and its sending, or to
// a failed send, costs the callers waiting on that run or update their
// polling interval (a second at most): Result and UpdateResult read it
// again anyway.
type announcer struct {
	mu      sync.Mutex
	pending []string // runs
	updates []int64
	sending bool
}

// announceTimeout bounds one send.
const announceTimeout = 5 * time.Second

// wakeTimeout bounds a wake-up sent after a commit (a child's queue).
const wakeTimeout = 5 * time.Second

// announce queues the notification of run id's end, to be sent on pool.
func (a *announcer) announce(pool *pgxpool.Pool, id string) {
	a.mu.Lock()
	a.pending = append(a.pending, id)
	a.startLocked(pool)
}

// announceUpdate queues the notification of update uid's answer, to be
// sent on pool.
func (a *announcer) announceUpdate(pool *pgxpool.Pool, uid int64) {
	a.mu.Lock()
	a.updates = append(a.updates, uid)
	a.startLocked(pool)
}

// startLocked starts the sender unless it runs, and unlocks a.mu.
func (a *announcer) startLocked(pool *pgxpool.Pool) {
	if a.sending {
		a.mu.Unlock()
		return
	}
	a.sending = true
	a.mu.Unlock()
	go a.send(pool)
}

// send sends what is pending until nothing is.
func (a *announcer) send(pool *pgxpool.Pool) {
	for {
		a.mu.Lock()
		ids, uids := a.pending, a.updates
		a.pending, a.updates = nil, nil
		if len(ids) == 0 && len(uids) == 0 {
			a.sending = false
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		if ids == nil {
			ids = []string{}
		}
		if uids == nil {
			uids = []int64{}
		}
		ctx, cancel := context.WithTimeout(context.Background(), announceTimeout)
		pool.Exec(ctx, sqlAnnounceDone, ids, uids) //nolint:errcheck // Result and UpdateResult poll
		cancel()
	}
}
