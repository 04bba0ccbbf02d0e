package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// beat is what a step attempt's context carries for Heartbeat.
type beat struct {
	x   *execution
	pos int
	key string
	n   int // the attempt
	// touch restarts the attempt's heartbeat timeout (watchHeartbeats),
	// nil without one.
	mu    sync.Mutex
	touch func()
}

// touched restarts the attempt's heartbeat timeout, if it has one.
func (b *beat) touched() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.touch != nil {
		b.touch()
	}
}

// ErrHeartbeatTimeout is matched by the error of a step attempt that did
// not heartbeat within StepOpts.HeartbeatTimeout, on every execution; so
// is ErrStepTimeout.
var ErrHeartbeatTimeout = errors.New("workflow: step attempt stopped heartbeating")

// errLapsed is the cause of an attempt's context that its heartbeat
// timeout ended.
var errLapsed = errors.New("workflow: heartbeat timeout")

// watchHeartbeats ends ctx (cause errLapsed) once d passes without a
// Heartbeat of the attempt ctx is given to; stop ends the watch. d <= 0
// watches nothing. The timer is this process's: a heartbeat timeout
// bounds an attempt as it runs, as StepOpts.Timeout does.
func watchHeartbeats(ctx context.Context, d time.Duration) (context.Context, func()) {
	if d <= 0 {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	t := time.AfterFunc(d, func() { cancel(errLapsed) })
	if b, ok := ctx.Value(beatKey{}).(*beat); ok {
		b.mu.Lock()
		b.touch = func() { t.Reset(d) }
		b.mu.Unlock()
	}
	return ctx, func() { t.Stop(); cancel(nil) }
}

// lapsed reports whether ctx ended for want of a heartbeat.
func lapsed(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errLapsed) }

// heartbeatError is the error of an attempt that stopped heartbeating for
// d: ErrHeartbeatTimeout and ErrStepTimeout, and err, what the step
// returned then (nil: it had not returned).
func heartbeatError(d time.Duration, err error) error {
	if err != nil {
		return fmt.Errorf("%w: no heartbeat for %s (%w): %w", ErrHeartbeatTimeout, d, ErrStepTimeout, err)
	}
	return fmt.Errorf("%w: no heartbeat for %s (%w); its result, if it ever returns, is discarded", ErrHeartbeatTimeout, d, ErrStepTimeout)
}

type beatKey struct{}

// withBeat gives a step attempt's context what Heartbeat needs. It reads
// only what an execution never changes, so the attempt's function may
// heartbeat from any goroutine.
func withBeat(ctx context.Context, x *execution, p stepPlan) context.Context {
	return context.WithValue(ctx, beatKey{}, &beat{x: x, pos: p.pos, key: p.key, n: p.n})
}

// ErrNotInStep: Heartbeat or HeartbeatDetails was called with a context
// that is not a step attempt's (Step, StepTx, Go).
var ErrNotInStep = errors.New("workflow: not called from a step's function")

// MaxHeartbeatBytes bounds a heartbeat's details, encoded as JSON (64 KiB):
// Heartbeat refuses more with ErrTooLarge.
const MaxHeartbeatBytes = 64 << 10

// heartbeatTimeout bounds one Heartbeat's write.
const heartbeatTimeout = 5 * time.Second

// Heartbeat records details (encoded as JSON) as the progress of the step
// whose function ctx was given to (Step, StepTx, Go): the step's next
// attempt, after a failure, a timeout, a crash or a rescue, reads them
// with HeartbeatDetails and goes on from there (Temporal's activity
// heartbeat), so a long step can have a short StepOpts.Timeout and lose
// little when an attempt dies. Each call replaces the step's earlier
// details; the write is fenced by the run job's lease (an attempt whose
// execution lost the run records nothing, and Heartbeat returns
// core.ErrLeaseLost's text) and bounded to a few seconds. It may be called
// from any goroutine of the step's function. Details over
// MaxHeartbeatBytes are ErrTooLarge; a context that is not a step's is
// ErrNotInStep.
func Heartbeat(ctx context.Context, details any) error {
	b, ok := ctx.Value(beatKey{}).(*beat)
	if !ok {
		return fmt.Errorf("workflow: heartbeat: %w", ErrNotInStep)
	}
	enc, err := encode("heartbeat details", details)
	if err == nil && len(enc) > MaxHeartbeatBytes {
		err = fmt.Errorf("%w: the details encode to %d bytes, over MaxHeartbeatBytes (%d)", ErrTooLarge, len(enc), MaxHeartbeatBytes)
	}
	if err != nil {
		return fmt.Errorf("workflow: heartbeat of step %q in run %s: %w", b.key, b.x.runID, err)
	}
	wctx, cancel := context.WithTimeout(ctx, heartbeatTimeout)
	defer cancel()
	x := b.x
	ct, err := x.r.pool.Exec(wctx, sqlHeartbeat, x.runID, b.pos, b.key, b.n, string(enc), x.job.ID, x.job.LeaseToken.String())
	if err != nil {
		return fmt.Errorf("workflow: heartbeat of step %q in run %s: %w", b.key, x.runID, err)
	}
	if ct.RowsAffected() == 0 {
		return fmt.Errorf("workflow: heartbeat of step %q in run %s: the attempt no longer holds the run's lease, or a later attempt of the step recorded its own", b.key, x.runID)
	}
	b.touched()
	return nil
}

// HeartbeatDetails returns the details the step's latest Heartbeat
// recorded, decoded into T, and true; false when the step never
// heartbeat (its first attempt, typically). Called from the function of a
// step (ctx is the attempt's), it is how an attempt resumes where an
// earlier one got to. Details that do not decode into T are an error.
func HeartbeatDetails[T any](ctx context.Context) (T, bool, error) {
	var v T
	b, ok := ctx.Value(beatKey{}).(*beat)
	if !ok {
		return v, false, fmt.Errorf("workflow: heartbeat details: %w", ErrNotInStep)
	}
	var raw []byte
	err := b.x.r.pool.QueryRow(ctx, sqlHeartbeatDetails, b.x.runID, b.pos, b.key).Scan(&raw)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return v, false, nil
	case err != nil:
		return v, false, fmt.Errorf("workflow: heartbeat details of step %q in run %s: %w", b.key, b.x.runID, err)
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, false, fmt.Errorf("workflow: heartbeat details of step %q in run %s: decode into %T: %w", b.key, b.x.runID, v, err)
	}
	return v, true, nil
}
