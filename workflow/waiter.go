package workflow

import (
	"context"
	"sync"
	"time"

	"github.com/relayq/relay/internal/notifier"
)

// waiter is a registry's one LISTEN connection for Result and UpdateResult
// callers: each finished run's notification (channel relay_workflow,
// payload the run id) wakes the callers waiting on that run, and each
// answered update's (channel relay_workflow_update, payload its id) the
// callers waiting on that update (keyed updateKey). It runs while anyone waits, and
// stops waiterIdle after the last one left, so an idle registry holds no
// connection. It holds no pool slot (notifier connects on its own).
type waiter struct {
	r         *Registry
	mu        sync.Mutex
	waiting   map[string][]*sub
	n         int
	cancel    context.CancelFunc // the listener's, nil when not running
	connected chan struct{}      // closed once the listener listens
	// connectedOnce closes connected (the listener's first connect, or
	// close).
	connectedOnce *sync.Once
	idle          *time.Timer
	closed        bool // Registry.Close: no listener any more; Result polls
}

// close stops the listener for good.
func (w *waiter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.idle != nil {
		w.idle.Stop()
		w.idle = nil
	}
	if w.cancel != nil {
		w.cancel()
		w.cancel = nil
	}
	// Callers waiting for the listener to connect, or for a
	// notification, go on at once, and poll.
	if w.connectedOnce != nil {
		ch := w.connected
		w.connectedOnce.Do(func() { close(ch) })
	} else {
		w.connected = make(chan struct{})
		close(w.connected)
	}
	for id, list := range w.waiting {
		for _, s := range list {
			s.fire()
		}
		delete(w.waiting, id)
	}
}

// sub is one caller's interest in one or more runs: its channel is closed
// once, by the first of them to finish.
type sub struct {
	ch   chan struct{}
	once sync.Once
	// single: the sub waits on one run (Handle.Result), and may be handed
	// its outcome (deliver).
	single bool
	// outcome is the run's outcome when this process recorded it (set
	// before ch is closed, read after), else nil: read the run.
	outcome *finished
}

func (s *sub) fire() { s.once.Do(func() { close(s.ch) }) }

// fireWith closes the channel with the run's outcome, for a sub on that
// one run.
func (s *sub) fireWith(f *finished) {
	s.once.Do(func() {
		if s.single {
			s.outcome = f
		}
		close(s.ch)
	})
}

// finished is a run's outcome as its execution recorded it (the values
// its outcome's statement wrote).
type finished struct {
	workflow string
	state    RunState
	output   []byte // the encoded output (completed runs)
	msg      string
}

// open reports whether Result may wait on the listener.
func (w *waiter) open() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.closed
}

const waiterIdle = 10 * time.Second

// subscribe registers interest in run id and returns its sub, whose
// channel is closed when it may have finished (with its outcome when this
// process recorded it), a channel closed once the listener listens, and
// the release to call when done waiting.
func (w *waiter) subscribe(id string) (*sub, <-chan struct{}, func()) {
	s := &sub{ch: make(chan struct{}), single: true}
	connected, release := w.add(s, []string{id})
	return s, connected, release
}

// subscribeAll is subscribe for the runs of ids: its channel is closed
// when any of them may have finished.
func (w *waiter) subscribeAll(ids []string) (<-chan struct{}, <-chan struct{}, func()) {
	s := &sub{ch: make(chan struct{})}
	connected, release := w.add(s, ids)
	return s.ch, connected, release
}

// add registers s on the runs of ids (subscribe).
func (w *waiter) add(s *sub, ids []string) (<-chan struct{}, func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiting == nil {
		w.waiting = map[string][]*sub{}
	}
	if w.closed {
		s.fire() // no notification will come: read the runs again
	} else {
		for _, id := range ids {
			w.waiting[id] = append(w.waiting[id], s)
		}
	}
	w.n++
	if w.idle != nil {
		w.idle.Stop()
		w.idle = nil
	}
	if w.cancel == nil && !w.closed {
		ctx, cancel := context.WithCancel(context.Background())
		w.cancel = cancel
		connected := make(chan struct{})
		once := &sync.Once{}
		w.connected, w.connectedOnce = connected, once
		go notifier.Run(ctx, notifier.Config{
			Pool:      w.r.pool,
			Channels:  []string{"relay_workflow", "relay_workflow_update"},
			OnNotify:  func(channel, payload string) { w.notified(channel, payload) },
			OnConnect: func() { once.Do(func() { close(connected) }); w.wakeAll() },
			Logger:    w.r.logger,
			AppName:   "relay-workflow-results",
		})
	}
	connected := w.connected
	release := func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, id := range ids {
			list := w.waiting[id]
			for i, c := range list {
				if c == s {
					list = append(list[:i], list[i+1:]...)
					break
				}
			}
			if len(list) == 0 {
				delete(w.waiting, id)
			} else {
				w.waiting[id] = list
			}
		}
		w.n--
		if w.n == 0 && w.cancel != nil {
			cancel := w.cancel
			w.idle = time.AfterFunc(waiterIdle, func() {
				w.mu.Lock()
				defer w.mu.Unlock()
				if w.n == 0 && w.cancel != nil {
					cancel()
					w.cancel = nil
				}
			})
		}
	}
	return connected, release
}

// updateKey is the key the callers waiting on update uid's answer wait
// under: a run id cannot hold a NUL byte (PostgreSQL's text cannot), so no
// run's key is an update's.
func updateKey(uid string) string { return "\x00update:" + uid }

// notified wakes the callers a notification concerns.
func (w *waiter) notified(channel, payload string) {
	if channel == "relay_workflow_update" {
		payload = updateKey(payload)
	}
	w.wake(payload)
}

// wake closes the channels of the callers waiting on key (a run id, or an
// updateKey).
func (w *waiter) wake(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.waiting[id] {
		s.fire()
	}
	delete(w.waiting, id)
}

// deliver hands run id's outcome, which this process has just committed,
// to the callers waiting on it here: they return it without a read, and
// without waiting for the notification, which other processes still get
// (announcer). A caller on several runs (Results) is woken to read them.
func (w *waiter) deliver(id string, f *finished) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.waiting[id] {
		s.fireWith(f)
	}
	delete(w.waiting, id)
}

// wakeAll wakes every caller (after a reconnection: notifications may have
// been missed), who then reads its run again.
func (w *waiter) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, list := range w.waiting {
		for _, s := range list {
			s.fire()
		}
		delete(w.waiting, id)
	}
}
