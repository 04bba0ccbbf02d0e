package workflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
)

// IDConflictPolicy is what Start does when a run with StartOpts.ID exists
// and has not finished (StartOpts.IDConflict).
type IDConflictPolicy int

const (
	// IDConflictUseExisting returns the run that exists (Handle.Existing);
	// nothing is started, and a different input is ignored. The default.
	IDConflictUseExisting IDConflictPolicy = iota
	// IDConflictFail refuses the start with a *RunExistsError (ErrRunExists).
	IDConflictFail
	// IDConflictTerminateExisting terminates the run that exists (as
	// Terminate, and its unfinished descendants with it), deletes it with
	// its history, and starts the new one, in one transaction.
	IDConflictTerminateExisting
)

// IDReusePolicy is what Start does when a run with StartOpts.ID exists and
// has finished (StartOpts.IDReuse).
type IDReusePolicy int

const (
	// IDReuseUseExisting returns the finished run (Handle.Existing):
	// nothing is started, so starting an id twice is one run. The default.
	IDReuseUseExisting IDReusePolicy = iota
	// IDReuseAllow deletes the finished run with its history (as Delete)
	// and starts a new one under the id, in one transaction.
	IDReuseAllow
	// IDReuseAllowIfNotCompleted is IDReuseAllow when the finished run did
	// not complete (it failed, was compensated, cancelled or terminated),
	// and a *RunExistsError when it completed.
	IDReuseAllowIfNotCompleted
	// IDReuseRefuse refuses the start with a *RunExistsError.
	IDReuseRefuse
)

// ErrRunExists is matched by the *RunExistsError of a start that
// StartOpts.IDConflict or IDReuse refused.
var ErrRunExists = errors.New("workflow: a run with this id exists")

// RunExistsError is a start refused because a run with its id exists:
// its state says whether that run was running or how it ended.
type RunExistsError struct {
	RunID string
	State RunState
}

func (e *RunExistsError) Error() string {
	return fmt.Sprintf("workflow: run %s exists (%s) and the start's id policy refuses to start another", e.RunID, e.State)
}

// Is matches ErrRunExists.
func (e *RunExistsError) Is(target error) bool { return target == ErrRunExists }

// checkIDPolicies refuses a policy value out of range.
func (o *StartOpts) checkIDPolicies() error {
	if o.IDConflict < IDConflictUseExisting || o.IDConflict > IDConflictTerminateExisting {
		return fmt.Errorf("%w: StartOpts.IDConflict %d is no IDConflictPolicy", ErrBadOptions, o.IDConflict)
	}
	if o.IDReuse < IDReuseUseExisting || o.IDReuse > IDReuseRefuse {
		return fmt.Errorf("%w: StartOpts.IDReuse %d is no IDReusePolicy", ErrBadOptions, o.IDReuse)
	}
	return nil
}

// mayReplace reports whether the start may replace a run that exists.
func (o *StartOpts) mayReplace() bool {
	return o.IDConflict == IDConflictTerminateExisting || o.IDReuse == IDReuseAllow || o.IDReuse == IDReuseAllowIfNotCompleted
}

// settleExisting applies the start's id policies to the run of this
// workflow that holds o.ID, in db's transaction: false and nil to return
// it (Handle.Existing), a *RunExistsError to refuse, true once it was
// terminated (if unfinished) and deleted, for the new run to take its id.
func (o *StartOpts) settleExisting(ctx context.Context, db core.DB, ex dbx.Execer, name string) (bool, error) {
	var state RunState
	found := false
	// The row lock holds the run's state until this transaction ends: an
	// execution cannot finish it meanwhile.
	if err := ex.Query(ctx, sqlLockRunState, []any{o.ID}, func(r dbx.Scanner) error { found = true; return r.Scan(&state) }); err != nil {
		return false, fmt.Errorf("read run %s: %w", o.ID, err)
	}
	if !found {
		return false, nil // deleted meanwhile: the existing run is gone, as for a race with Delete
	}
	refuse := &RunExistsError{RunID: o.ID, State: state}
	if !state.Final() {
		switch o.IDConflict {
		case IDConflictUseExisting:
			return false, nil
		case IDConflictFail:
			return false, refuse
		}
		// Terminate the run and its unfinished descendants, parents first
		// (the tree's lock order), so that the tree can be deleted.
		var ids []string
		if err := ex.Query(ctx, sqlUnfinishedTree, []any{o.ID}, func(r dbx.Scanner) error {
			var id string
			if err := r.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
			return nil
		}); err != nil {
			return false, fmt.Errorf("list the unfinished runs of %s: %w", o.ID, err)
		}
		for _, id := range ids {
			msg := terminatedMsg(id, "replaced by a new start of "+name+" (StartOpts.IDConflict)")
			if _, err := terminate(ctx, db, id, msg); err != nil && !errors.Is(err, ErrRunFinished) {
				return false, fmt.Errorf("terminate run %s: %w", id, err)
			}
		}
	} else {
		switch {
		case o.IDReuse == IDReuseUseExisting:
			return false, nil
		case o.IDReuse == IDReuseRefuse, o.IDReuse == IDReuseAllowIfNotCompleted && state == StateCompleted:
			return false, refuse
		}
	}
	n, err := ex.Exec(ctx, sqlDeleteRun, o.ID)
	if err != nil {
		return false, fmt.Errorf("delete run %s: %w", o.ID, err)
	}
	if n == 0 {
		return false, fmt.Errorf("delete run %s to start it anew: a child run of it has not finished yet", o.ID)
	}
	return true, nil
}
