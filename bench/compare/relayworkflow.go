package main

import "github.com/relayq/relay/internal/bench"

// relayWorkflowSystems is Relay's side of the workflow workloads.
func relayWorkflowSystems() []bench.WorkflowSystem {
	return []bench.WorkflowSystem{bench.RelayWorkflow{}}
}
