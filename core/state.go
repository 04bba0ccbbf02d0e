package core

// Transitions is the state machine: for each state, the states a job may move
// to. It mirrors the trigger relay_jobs_check_transition in the migrations and
// docs/state-machine.md; a test holds the three together.
var transitions = map[JobState][]JobState{
	StateQueued:    {StateClaimed, StateCancelled},
	StateClaimed:   {StateSucceeded, StateQueued, StateDead, StateCancelled},
	StateDead:      {StateQueued},
	StateCancelled: {StateQueued},
	StateSucceeded: nil,
}

// CanTransitionTo reports whether the job state machine lets a job in state s
// move to state to.
func (s JobState) CanTransitionTo(to JobState) bool {
	for _, next := range transitions[s] {
		if next == to {
			return true
		}
	}
	return false
}

// States lists every state, in diagram order.
func States() []JobState {
	return []JobState{StateQueued, StateClaimed, StateSucceeded, StateDead, StateCancelled}
}
