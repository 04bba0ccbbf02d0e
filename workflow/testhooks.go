package workflow

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/relayq/relay/internal/wfhook"
)

// The test environment's ways into an execution (package workflowtest,
// through internal/wfhook): each is a nil check when none is installed.

// clock is the time Now records and the attempt log keeps: the test
// environment's virtual clock when it installed one.
func (x *execution) clock() time.Time {
	if x.hooks != nil && x.hooks.Now != nil {
		return x.hooks.Now()
	}
	return time.Now()
}

// fakeStep returns the test environment's fake of step key, or fn.
func fakeStep[T any](x *execution, key string, fn func(ctx context.Context) (T, error)) func(ctx context.Context) (T, error) {
	if x.hooks == nil || x.hooks.Step == nil {
		return fn
	}
	fake := x.hooks.Step(x.runID, key)
	if fake == nil {
		return fn
	}
	return func(ctx context.Context) (T, error) {
		var out T
		b, err := fake(ctx)
		if err != nil {
			return out, err
		}
		if err := json.Unmarshal(b, &out); err != nil {
			return out, permanent(fmt.Errorf("workflowtest: the fake of step %q returned %s, which does not decode into %T: %w", key, b, out, err))
		}
		return out, nil
	}
}

// fakeWorkflow returns the test environment's fake of the run's workflow,
// or nil.
func (x *execution) fakeWorkflow() *definition {
	if x.hooks == nil || x.hooks.Workflow == nil {
		return nil
	}
	call, ok := x.hooks.Workflow(x.run.workflow).(func(Context, []byte) ([]byte, error))
	if !ok {
		return nil
	}
	return &definition{name: x.run.workflow, call: call}
}

// crashAt ends the execution at point p of step key as a worker killed
// there would, when the test environment asks: nothing more of it is
// written (deferred checkpoints are lost), and the core retries the run's
// job as a crashed execution's.
func (x *execution) crashAt(key string, p wfhook.Point) {
	if x.hooks == nil || x.hooks.Crash == nil || !x.hooks.Crash(x.runID, key, p) {
		return
	}
	if p == wfhook.BeforeStep {
		// "Before the step": every earlier checkpoint has committed, as
		// before an inline step's function (a StepTx carries them in its
		// own transaction otherwise).
		x.settleBookkeeping()
	}
	x.stop(&unwind{kind: unwindAbort, err: fmt.Errorf("workflow: run %s: step %q: %w", x.runID, key, wfhook.ErrCrashed)})
}
