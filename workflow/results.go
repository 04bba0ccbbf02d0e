package workflow

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
)

// RunResult is the outcome of one run of a Results call: its output, or
// Err (a *RunError, ErrRunNotFound, a decode error).
type RunResult[Out any] struct {
	ID     string
	Output Out
	Err    error
}

// Results waits for every run of handles to finish and returns their
// outcomes in the order of handles: a StartMany's runs awaited together.
// It reads the runs not yet finished in one query each time one of them
// may have finished (the registry's one LISTEN connection, as
// Handle.Result; a one-second poll as the fallback), whatever their number.
// ctx bounds the wait: when it ends, Results returns the outcomes it has,
// the runs still running with ctx's error as their Err, and ctx's error.
func Results[Out any](ctx context.Context, db core.DB, handles []Handle[Out]) ([]RunResult[Out], error) {
	out := make([]RunResult[Out], len(handles))
	if len(handles) == 0 {
		return out, nil
	}
	ex, err := dbx.For(db)
	if err != nil {
		return nil, fmt.Errorf("workflow: results: %w", err)
	}
	var w *waiter
	if reg := handles[0].reg; reg != nil && reg.pool != nil && reg.waiter.open() {
		w = &reg.waiter
	}
	// Positions by id (a handle given twice gets its outcome twice).
	pending := map[string][]int{}
	for i, h := range handles {
		out[i].ID = h.ID
		pending[h.ID] = append(pending[h.ID], i)
	}
	delay := 2 * time.Millisecond
	for len(pending) > 0 {
		ids := make([]string, 0, len(pending))
		for id := range pending {
			ids = append(ids, id)
		}
		var woken, connected <-chan struct{}
		release := func() {}
		if w != nil && w.open() {
			woken, connected, release = w.subscribeAll(ids)
			select {
			case <-connected:
			case <-time.After(5 * time.Second):
			case <-ctx.Done():
			}
		}
		idsJSON, _ := json.Marshal(ids)
		err := ex.Query(ctx, sqlRunOutcomes, []any{string(idsJSON)}, func(r dbx.Scanner) error {
			var id, name, state, output, msg string
			if err := r.Scan(&id, &name, &state, &output, &msg); err != nil {
				return err
			}
			var res RunResult[Out]
			switch s := RunState(state); {
			case s == "":
				res.Err = fmt.Errorf("workflow: result of %s: %w", id, ErrRunNotFound)
			case s == StateCompleted:
				if err := json.Unmarshal([]byte(output), &res.Output); err != nil {
					res.Err = fmt.Errorf("workflow: result of %s: decode output into %T: %w", id, res.Output, err)
				}
			default:
				res.Err = &RunError{RunID: id, Workflow: name, State: s, Message: msg}
			}
			for _, i := range pending[id] {
				res.ID = id
				out[i] = res
			}
			delete(pending, id)
			return nil
		})
		if err != nil {
			release()
			if ctx.Err() != nil {
				break
			}
			return nil, fmt.Errorf("workflow: results: %w", err)
		}
		if len(pending) == 0 {
			release()
			break
		}
		if woken != nil {
			delay = time.Second // the notification comes first; this is the fallback
		}
		select {
		case <-ctx.Done():
		case <-woken:
		case <-time.After(delay):
		}
		release()
		if ctx.Err() != nil {
			break
		}
		delay = min(delay*2, time.Second)
	}
	if ctx.Err() != nil && len(pending) > 0 {
		for id, is := range pending {
			for _, i := range is {
				out[i] = RunResult[Out]{ID: id, Err: fmt.Errorf("workflow: result of %s: %w", id, ctx.Err())}
			}
		}
		return out, fmt.Errorf("workflow: results: %d of %d runs unfinished: %w", len(pending), len(handles), ctx.Err())
	}
	return out, nil
}
