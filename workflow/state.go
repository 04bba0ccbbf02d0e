package workflow

// RunState is a run's place in its state machine (docs/workflow.md).
type RunState string

const (
	// StatePending runs wait for their first execution (or, after Retry,
	// their next one).
	StatePending RunState = "pending"
	// StateRunning runs are executing, or suspended between executions
	// (sleeping, waiting for a signal or a child, or a step's retry delay).
	StateRunning RunState = "running"
	// StateCompensating runs failed or were cancelled and are running their
	// compensations, newest first.
	StateCompensating RunState = "compensating"
	// StateCompleted runs returned an output.
	StateCompleted RunState = "completed"
	// StateFailed runs returned an error (with nothing to compensate, or a
	// compensation failed), broke determinism, or crashed their executions
	// too often. Retry brings one back.
	StateFailed RunState = "failed"
	// StateCompensated runs failed and their compensations all ran.
	StateCompensated RunState = "compensated"
	// StateCancelled runs were cancelled (their compensations, if any, ran).
	StateCancelled RunState = "cancelled"
	// StateTerminated runs were ended by Terminate, at once, wherever they
	// were, without running their compensations.
	StateTerminated RunState = "terminated"
)

// Final reports whether a run in this state is finished.
func (s RunState) Final() bool {
	return s == StateCompleted || s == StateFailed || s == StateCompensated || s == StateCancelled || s == StateTerminated
}

// transitions mirrors the trigger relay_workflow_runs_check and the table
// of docs/workflow.md; TestRunStateMachine holds the three together.
var transitions = map[RunState][]RunState{
	StatePending:      {StateRunning, StateCompleted, StateFailed, StateCancelled, StateTerminated},
	StateRunning:      {StateCompleted, StateFailed, StateCompensating, StateCancelled, StateTerminated},
	StateCompensating: {StateCompensated, StateCancelled, StateFailed, StateTerminated},
	StateFailed:       {StatePending},
	StateCompleted:    nil,
	StateCompensated:  nil,
	StateCancelled:    nil,
	StateTerminated:   nil,
}

// CanTransitionTo reports whether the run state machine lets a run in state
// s move to state to.
func (s RunState) CanTransitionTo(to RunState) bool {
	for _, next := range transitions[s] {
		if next == to {
			return true
		}
	}
	return false
}

// RunStates lists every run state.
func RunStates() []RunState {
	return []RunState{StatePending, StateRunning, StateCompensating, StateCompleted, StateFailed, StateCompensated, StateCancelled, StateTerminated}
}
