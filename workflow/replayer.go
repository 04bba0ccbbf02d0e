package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/relayq/relay/core"
)

// ReplayError is a history that the registry's code does not replay as it
// was recorded: Err is a *NonDeterminismError naming the run, the position
// and both keys, or what else stopped the replay (a stored value that no
// longer decodes, a duplicate key).
type ReplayError struct {
	RunID    string
	Workflow string
	Err      error
}

func (e *ReplayError) Error() string {
	return fmt.Sprintf("workflow: replay of run %s (%s): %v", e.RunID, e.Workflow, e.Err)
}

func (e *ReplayError) Unwrap() error { return e.Err }

// Replay replays each history with the workflows registered in reg, as an
// execution of the run would after a deploy of this code, but without side
// effects: no step function runs, nothing is read from or written to the
// database, and the replay of a run stops at the first position its
// history does not hold settled (a run in flight) or where the code asks
// for a step past the history's end. Compensations of a run whose function
// returned an error are replayed too.
//
// It returns nil when every history replays; otherwise one error per
// history that does not (joined with errors.Join): a *ReplayError, or an
// error matching ErrBadHistory for a history of another format version,
// a truncated one, or one of a workflow reg does not hold. CI runs it over
// histories exported from production (ReadHistory, `relay runs history`)
// to refuse a deploy that would break runs in flight.
func Replay(ctx context.Context, reg *Registry, histories ...*History) error {
	if reg == nil {
		return errors.New("workflow: replay: nil registry")
	}
	var errs []error
	for _, h := range histories {
		if err := reg.replay(ctx, h); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// replay replays one history (Replay).
func (r *Registry) replay(ctx context.Context, h *History) error {
	if err := h.check(); err != nil {
		return err
	}
	def := r.byName[h.Run.Workflow]
	if def == nil {
		return fmt.Errorf("%w: run %s is a run of workflow %q, which this registry does not hold", ErrBadHistory, h.Run.ID, h.Run.Workflow)
	}
	x := &execution{r: r, job: &core.Job[runArgs]{}, runID: h.Run.ID, def: def, now: h.ExportedAt,
		keys: map[string]int{}, waitSeq: map[string]int{}, eventSeq: map[string]int{}, patches: map[string]bool{},
		goroutine: goroutineID(), dryRun: true, ctx: ctx, hist: make(map[int]*stepRow, len(h.Steps))}
	x.run = runInfo{workflow: h.Run.Workflow, state: string(h.Run.State), input: string(h.Run.Input),
		parentID: h.Run.ParentID, generation: h.Run.Generation, cancelRequested: h.Run.CancelRequested}
	if x.now.IsZero() {
		x.now = time.Now()
	}
	x.cancelling = h.Run.CancelRequested
	for _, s := range h.Steps {
		row := &stepRow{position: s.Position, key: s.Key, kind: s.Kind, state: s.State, output: string(s.Output),
			errMsg: s.Error, errInfo: string(s.ErrorInfo), attempts: s.Attempts, wakeAt: s.WakeAt, childID: s.ChildID}
		x.hist[s.Position] = row
	}
	fail := func(err error) error { return &ReplayError{RunID: h.Run.ID, Workflow: h.Run.Workflow, Err: err} }
	_, err, u := x.call()
	if u == nil {
		u = x.unwinding
	}
	if m := x.misused.Load(); m != nil {
		return fail(m.err)
	}
	compensate := false
	switch {
	case u != nil && u.kind == unwindFatal:
		return fail(u.err)
	case u != nil && u.kind == unwindCancel:
		compensate = true
	case u != nil:
		return nil // the end of what history settled: the run goes on from here
	case err == nil && x.cancelling:
		compensate = true // a cancel seen after the last step: it won over the output
	case err != nil:
		var fe *fatalError
		if errors.As(err, &fe) {
			return fail(fe.err)
		}
		compensate = true
	}
	if compensate && len(x.comps) > 0 {
		if u := x.replayCompensations(); u != nil {
			if u.kind == unwindFatal {
				return fail(u.err)
			}
			return nil
		}
	}
	if nd := x.unreached(); nd != nil {
		return fail(nd)
	}
	return nil
}

// replayCompensations replays the registered compensations as compensate
// runs them, returning the unwind that stopped them (nil: all replayed).
func (x *execution) replayCompensations() (u *unwind) {
	x.compensating = true
	defer func() {
		if p := recover(); p != nil {
			uw, ok := p.(*unwind)
			if !ok {
				panic(p)
			}
			u = uw
		}
	}()
	wctx := Context{Context: x.ctx, x: x}
	for i := len(x.comps) - 1; i >= 0; i-- {
		c := x.comps[i]
		step(wctx, compensationPrefix+c.key, func(ctx context.Context) (struct{}, error) { return struct{}{}, c.fn(ctx) }, nil) //nolint:errcheck // a failed compensation is history's
	}
	return nil
}

// endDryRun stops a dry run (Replay) where the execution would read or
// write the database: history ends there.
func (x *execution) endDryRun() {
	if x.dryRun {
		x.stop(&unwind{kind: unwindReplayEnd})
	}
}
