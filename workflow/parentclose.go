package workflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
)

// ParentClosePolicy is what a child's parent's end does to the child if it
// has not finished (ChildOpts.ParentClose).
type ParentClosePolicy int

const (
	// ParentCloseCancel asks the child to cancel: it runs its
	// compensations and ends cancelled. The default.
	ParentCloseCancel ParentClosePolicy = iota
	// ParentCloseAbandon leaves the child running: neither its parent's
	// end nor a Cancel of its parent reaches it (nor its own children).
	ParentCloseAbandon
	// ParentCloseTerminate terminates the child (as Terminate: at once,
	// without its compensations) when its parent ends.
	ParentCloseTerminate
)

// stored is the policy as relay_workflow_runs.parent_close holds it.
func (p ParentClosePolicy) stored() string {
	switch p {
	case ParentCloseAbandon:
		return "abandon"
	case ParentCloseTerminate:
		return "terminate"
	}
	return ""
}

func (p ParentClosePolicy) check() error {
	if p < ParentCloseCancel || p > ParentCloseTerminate {
		return fmt.Errorf("%w: ChildOpts.ParentClose %d is no ParentClosePolicy", ErrBadOptions, p)
	}
	return nil
}

// terminateChildren terminates the unfinished children of run id whose
// policy is ParentCloseTerminate (and, through terminate, theirs), in tx:
// the run is ending.
func terminateChildren(ctx context.Context, tx core.DB, id string) error {
	ex, err := dbx.For(tx)
	if err != nil {
		return err
	}
	var kids []string
	if err := ex.Query(ctx, sqlChildrenToTerminate, []any{id}, func(r dbx.Scanner) error {
		var k string
		if err := r.Scan(&k); err != nil {
			return err
		}
		kids = append(kids, k)
		return nil
	}); err != nil {
		return fmt.Errorf("list the children to terminate: %w", err)
	}
	for _, k := range kids {
		msg := terminatedMsg(k, "its parent "+id+" ended (ChildOpts.ParentClose is ParentCloseTerminate)")
		if _, err := terminate(ctx, tx, k, msg); err != nil && !errors.Is(err, ErrRunFinished) {
			return fmt.Errorf("terminate child %s: %w", k, err)
		}
	}
	return nil
}
