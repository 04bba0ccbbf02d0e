package workflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
)

// ErrRunTerminated is matched by the *RunError of a run ended by
// Terminate.
var ErrRunTerminated = errors.New("workflow: run terminated")

// MaxReasonBytes bounds a Terminate reason (1 KiB): a longer one is
// ErrBadOptions.
const MaxReasonBytes = 1 << 10

// Terminate ends run id now, through db (joining its transaction): the run
// is recorded terminated, with reason in its error, wherever it was (a
// step, a sleep, a wait, its compensations), and none of its compensations
// run. It is the operator's hammer; Cancel is the polite stop that undoes.
//
// In the same transaction the run's job is cancelled (core.Cancel: a
// running execution's lease is gone, so it records nothing more, and its
// worker is told to stop it), its unfinished children are asked to cancel
// (as when any run ends), its parent is woken (its ChildFuture.Get returns a
// *ChildError of state terminated) and its Result callers are notified.
// A step's function running at that moment is not stopped mid-call: its
// context is cancelled, and what it returns is never checkpointed.
//
// A finished run is ErrRunFinished, naming the state it ended in; an
// unknown id ErrRunNotFound. A reason over MaxReasonBytes, or not UTF-8,
// is ErrBadOptions and nothing is written.
func Terminate(ctx context.Context, db core.DB, id, reason string) error {
	if err := checkReason(reason); err != nil {
		return fmt.Errorf("workflow: terminate run %s: %w", id, err)
	}
	err := inTx(ctx, db, func(tx core.DB) error {
		_, err := terminate(ctx, tx, id, terminatedMsg(id, reason))
		return err
	})
	if err != nil {
		return fmt.Errorf("workflow: terminate run %s: %w", id, err)
	}
	return nil
}

// checkReason refuses a reason too long or not clean text.
func checkReason(reason string) error {
	switch {
	case len(reason) > MaxReasonBytes:
		return fmt.Errorf("%w: the reason is %d bytes, over MaxReasonBytes (%d)", ErrBadOptions, len(reason), MaxReasonBytes)
	case boundError(reason) != reason:
		return fmt.Errorf("%w: the reason must be UTF-8 without NUL bytes", ErrBadOptions)
	}
	return nil
}

// terminatedMsg is the error of a run terminated for reason.
func terminatedMsg(id, reason string) string {
	if reason == "" {
		return fmt.Sprintf("workflow: run %s terminated", id)
	}
	return fmt.Sprintf("workflow: run %s terminated: %s", id, reason)
}

// terminate ends run id terminated in tx (see Terminate), and returns the
// job it cancelled (0 if none was left to cancel).
func terminate(ctx context.Context, tx core.DB, id, msg string) (int64, error) {
	ex, err := dbx.For(tx)
	if err != nil {
		return 0, err
	}
	var job int64
	found := false
	// The run's row first, then its job's (every writer's lock order).
	if err := ex.Query(ctx, sqlTerminateRun, []any{id, msg}, func(r dbx.Scanner) error { found = true; return r.Scan(&job) }); err != nil {
		return 0, fmt.Errorf("record the end: %w", err)
	}
	if !found {
		return 0, runMissing(ctx, ex, id)
	}
	// Its children whose policy is ParentCloseTerminate go with it (the
	// statement asked the others to cancel; abandoned ones run on).
	if err := terminateChildren(ctx, tx, id); err != nil {
		return 0, err
	}
	if job == 0 {
		return 0, nil
	}
	// The job's cancel also fires relay_workflow_job_ended, which finds
	// the run already finished and leaves it be.
	switch err := core.Cancel(ctx, tx, job); {
	case errors.Is(err, core.ErrIllegalTransition), errors.Is(err, core.ErrNotFound):
		return 0, nil // already ended (or deleted): nothing runs the run
	case err != nil:
		return 0, fmt.Errorf("cancel its job %d: %w", job, err)
	}
	return job, nil
}
