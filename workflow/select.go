package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A Case is one of the waits Select chooses between: a signal (OnSignal),
// a timer (OnTimer), a child run (OnChild) or a step started by Go
// (OnStep).
type Case interface {
	// ready reports, inside the select's transaction, whether the case
	// can be chosen now; a signal case consumes its signal there.
	ready(s *selection, ctx context.Context, tx pgx.Tx) (bool, error)
	// chosen sets the case's value from the select's checkpoint.
	chosen(x *execution, payload string) error
	// check refuses a case that is out of range.
	check() error
}

// selection is one Select's state while it decides.
type selection struct {
	x      *execution
	pos    int
	wakeAt *time.Time // the first timer's deadline (nil: none)
	now    time.Time
	dmin   time.Duration
	// payload is the chosen signal's, setAside the signals set aside.
	payload  string
	setAside []setAsideSignal
}

// selectRecord is a select's checkpoint: the case chosen, and a chosen
// signal's payload.
type selectRecord struct {
	Case    int             `json:"case"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Select waits for the first of several cases to be ready and returns its
// index in cases: a signal arrived (OnSignal), a timer passed (OnTimer), a
// child run finished (OnChild), a step started by Go returned (OnStep).
// When several are ready at once, the first listed wins. The choice is
// checkpointed under key, with a chosen signal's payload, in the
// transaction that consumes that signal: a replay returns the same index,
// whatever became ready since, so the run takes the same branch on every
// execution.
//
// The cases not chosen are left as they are: their signals stay in the
// mailbox (a later WaitSignal or Select receives them), their children go
// on running (ChildFuture.Get collects them; the parent's end closes one never
// collected), their steps go on (StepFuture.Get collects
// them; one never collected is cancelled when the execution ends), their
// timers are forgotten.
//
// With no step case still running, the run suspends until something wakes
// it (a signal, a child's end, the first timer's deadline), holding no
// goroutine or connection. While a step case runs, the execution waits for
// it in place, looking at the other cases again every second and at the
// first timer's deadline.
//
// An empty cases, a nil case or a timer of 0 or less is an error
// (ErrBadOptions) and nothing is recorded.
func Select(wctx Context, key string, cases ...Case) (int, error) {
	x := wctx.x
	if err := x.enter("Select"); err != nil {
		return -1, err
	}
	if len(cases) == 0 {
		return -1, fmt.Errorf("workflow: run %s: select %q: %w: no cases", x.runID, key, ErrBadOptions)
	}
	s := &selection{x: x}
	for i, c := range cases {
		if c == nil {
			return -1, fmt.Errorf("workflow: run %s: select %q: %w: case %d is nil", x.runID, key, ErrBadOptions, i)
		}
		if err := c.check(); err != nil {
			return -1, fmt.Errorf("workflow: run %s: select %q: case %d: %w", x.runID, key, i, err)
		}
		if t, ok := c.(*TimerCase); ok && (s.dmin == 0 || t.d < s.dmin) {
			s.dmin = t.d
		}
	}
	x.userKey("select", key)
	pos, h := x.next("select", key)
	s.pos = pos
	if h != nil && h.state == stepCompleted {
		return s.decided(cases, h.output)
	}
	if h != nil {
		s.wakeAt = h.wakeAt
	}
	x.checkCancel()
	began := time.Now()
	for {
		// The database's clock at the execution's start, moved on by the
		// time this select has waited in place.
		s.now = x.now.Add(time.Since(began))
		chosen := -1
		first := h == nil
		x.fenced(func(ctx context.Context, tx pgx.Tx) error {
			chosen, s.payload, s.setAside = -1, "", s.setAside[:0]
			for i, c := range cases {
				ok, err := c.ready(s, ctx, tx)
				if err != nil {
					return err
				}
				if ok {
					chosen = i
					break
				}
			}
			if chosen >= 0 {
				rec, _ := json.Marshal(selectRecord{Case: chosen, Payload: json.RawMessage(s.payload)}) // cannot fail: payload is stored JSON
				_, err := x.upsert(ctx, tx, &stepRow{position: pos, key: key, kind: "select", state: stepCompleted, output: string(rec)}, 1, nil, 0)
				return err
			}
			if !first {
				return nil
			}
			// The first reach: the select waits, its first timer's
			// deadline on the database's clock (where a virtual clock of
			// tests moves it too).
			var d time.Duration = -1
			if s.dmin > 0 {
				d = s.dmin
			}
			at, err := x.upsert(ctx, tx, &stepRow{position: pos, key: key, kind: "select", state: stepWaiting}, 0, nil, d)
			s.wakeAt = at
			if d < 0 {
				s.wakeAt = nil
			}
			return err
		})
		h = x.hist[pos]
		for _, a := range s.setAside {
			x.r.logger.Warn("relay: workflow signal set aside: its payload does not decode into the type its select asks for; the run waits on",
				"run_id", x.runID, "workflow", x.run.workflow, "select", key, "signal_id", a.id, "error", a.msg)
		}
		if chosen >= 0 {
			return s.decided(cases, x.hist[pos].output)
		}
		x.checkCancel() // the write read the cancel flag
		wait := maxSuspend
		if s.wakeAt != nil {
			wait = min(wait, s.wakeAt.Sub(s.now))
		}
		running := s.runningSteps(cases)
		if len(running) == 0 {
			x.suspend(wait)
		}
		// A step case runs in this execution: suspending would cancel it.
		// Wait here for a step to return, the first timer, or a second
		// (a signal or a child's end meanwhile).
		s.await(running, min(wait, time.Second))
	}
}

// decided sets the chosen case's value from the checkpoint and returns its
// index.
func (s *selection) decided(cases []Case, output string) (int, error) {
	var rec selectRecord
	if err := json.Unmarshal([]byte(output), &rec); err != nil || rec.Case < 0 || rec.Case >= len(cases) {
		// The code's cases changed under a run in flight.
		s.x.fatal(&NonDeterminismError{RunID: s.x.runID, Position: s.pos, HistoryKey: "select case " + string(output),
			CodeKey: fmt.Sprintf("select of %d cases", len(cases))})
	}
	if err := cases[rec.Case].chosen(s.x, string(rec.Payload)); err != nil {
		s.x.fatal(err)
	}
	return rec.Case, nil
}

// runningSteps are the step cases whose attempt runs in this execution.
func (s *selection) runningSteps(cases []Case) []<-chan struct{} {
	var out []<-chan struct{}
	for _, c := range cases {
		if r, ok := c.(interface{ running() <-chan struct{} }); ok {
			if ch := r.running(); ch != nil {
				out = append(out, ch)
			}
		}
	}
	return out
}

// await waits for one of chs to close, the execution's end, or d.
func (s *selection) await(chs []<-chan struct{}, d time.Duration) {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	any := make(chan struct{})
	stop := make(chan struct{})
	defer close(stop)
	for _, ch := range chs {
		go func() {
			select {
			case <-ch:
				select {
				case any <- struct{}{}:
				case <-stop:
				}
			case <-stop:
			}
		}()
	}
	select {
	case <-any:
	case <-t.C:
	case <-s.x.ctx.Done():
		s.x.stop(&unwind{kind: unwindAbort, err: fmt.Errorf("workflow: run %s: select interrupted: %w", s.x.runID, context.Cause(s.x.ctx))})
	}
}

// SignalCase is a Select case ready when a signal of its name arrives
// (OnSignal). Payload is the signal's, once the case was chosen.
type SignalCase[T any] struct {
	name    string
	payload T
}

// OnSignal is a Select case ready when a signal called name is in the
// run's mailbox; chosen, it consumes the oldest, as WaitSignal does, and
// Payload returns it decoded into T. A signal that does not decode into T
// is set aside, as WaitSignal's are.
func OnSignal[T any](name string) *SignalCase[T] { return &SignalCase[T]{name: name} }

// Payload is the signal received, once Select chose this case.
func (c *SignalCase[T]) Payload() T { return c.payload }

func (c *SignalCase[T]) check() error {
	if c.name == "" {
		return fmt.Errorf("%w: OnSignal with an empty name", ErrBadOptions)
	}
	return nil
}

func (c *SignalCase[T]) ready(s *selection, ctx context.Context, tx pgx.Tx) (bool, error) {
	for len(s.setAside) < maxSetAsidePerWrite {
		var id int64
		var p string
		err := tx.QueryRow(ctx, sqlConsumeSignal, s.x.runID, c.name, s.pos).Scan(&id, &p)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("consume signal %s: %w", c.name, err)
		}
		var v T
		if derr := json.Unmarshal([]byte(p), &v); derr != nil {
			msg := boundError(fmt.Sprintf("decode signal %s into %T: %v", c.name, v, derr))
			if _, err := tx.Exec(ctx, sqlSetSignalAside, id, msg); err != nil {
				return false, fmt.Errorf("set signal %d aside: %w", id, err)
			}
			s.setAside = append(s.setAside, setAsideSignal{id: id, msg: msg})
			continue
		}
		s.payload = p
		return true, nil
	}
	return false, nil // the rest next time
}

func (c *SignalCase[T]) chosen(x *execution, payload string) error {
	var v T
	if err := json.Unmarshal([]byte(payload), &v); err != nil {
		return fmt.Errorf("workflow: run %s: decode signal %s into %T: %w", x.runID, c.name, v, err)
	}
	c.payload = v
	return nil
}

// TimerCase is a Select case ready once its duration has passed (OnTimer).
type TimerCase struct{ d time.Duration }

// OnTimer is a Select case ready d after the select was first reached (on
// the database's clock, checkpointed with the select as a sleep's
// deadline is, so replays and restarts do not restart it). d must be
// positive.
func OnTimer(d time.Duration) *TimerCase { return &TimerCase{d: d} }

func (c *TimerCase) check() error {
	if c.d <= 0 {
		return fmt.Errorf("%w: OnTimer(%s): a timer must be positive", ErrBadOptions, c.d)
	}
	return nil
}

func (c *TimerCase) ready(s *selection, _ context.Context, _ pgx.Tx) (bool, error) {
	if s.wakeAt == nil {
		return false, nil // first reached now: no timer has passed
	}
	// The select's deadline is its first timer's; this one's is as much
	// later as it is longer.
	return !s.wakeAt.Add(c.d - s.dmin).After(s.now), nil
}

func (c *TimerCase) chosen(*execution, string) error { return nil }

// childCase is a Select case ready when a child run has finished.
type childCase struct {
	runID string
	err   error // Child was refused: ready at once, Get returns it
	steps func() *stepRow
}

// OnChild is a Select case ready when the child run f has finished
// (completed, failed, compensated or cancelled); f.Get then returns its
// outcome at once.
func OnChild[Out any](f *ChildFuture[Out]) Case {
	if f == nil {
		return nil
	}
	c := &childCase{runID: f.RunID, err: f.err}
	if f.err == nil && f.pos >= 0 {
		c.steps = func() *stepRow { return f.x.hist[f.pos] }
	}
	return c
}

func (c *childCase) check() error { return nil }

func (c *childCase) ready(_ *selection, ctx context.Context, tx pgx.Tx) (bool, error) {
	if c.err != nil || c.steps == nil {
		return true, nil
	}
	if h := c.steps(); h != nil && (h.state == stepCompleted || h.state == stepFailed) {
		return true, nil // collected, or refused its id
	}
	var state, output, msg string
	var final bool
	err := tx.QueryRow(ctx, sqlChildOutcome, c.runID).Scan(&state, &output, &msg, &final)
	if errors.Is(err, pgx.ErrNoRows) {
		return true, nil // deleted: Get says so
	}
	if err != nil {
		return false, fmt.Errorf("read child %s: %w", c.runID, err)
	}
	return final, nil
}

func (c *childCase) chosen(*execution, string) error { return nil }

// stepCase is a Select case ready when a step started by Go has returned.
type stepCase struct {
	done func() bool
	wait func() <-chan struct{}
}

// OnStep is a Select case ready when the step f (started by Go) has
// returned, or history holds its outcome; f.Get then returns at once.
func OnStep[T any](f *StepFuture[T]) Case {
	if f == nil {
		return nil
	}
	return &stepCase{done: f.returned, wait: f.returnedChan}
}

func (c *stepCase) check() error { return nil }

func (c *stepCase) ready(*selection, context.Context, pgx.Tx) (bool, error) { return c.done(), nil }

func (c *stepCase) chosen(*execution, string) error { return nil }

func (c *stepCase) running() <-chan struct{} {
	if c.done() {
		return nil
	}
	return c.wait()
}
