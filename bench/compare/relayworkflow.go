package main

import "github.com/relayq/relay/bench"

// relayWorkflowSystems is Relay's side of the workflow workloads: the
// queued start, and (latency workloads only) the eager start.
func relayWorkflowSystems() []bench.WorkflowSystem {
	return []bench.WorkflowSystem{bench.RelayWorkflow{}, bench.RelayWorkflow{Eager: true}}
}
