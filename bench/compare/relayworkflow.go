package main

import "github.com/relayq/relay/bench"

// relayWorkflowSystems is Relay's side of the workflow workloads: the
// queued start, (latency workloads only) the eager start, and (the starts
// workload only) batches of starts in one transaction and StartMany.
func relayWorkflowSystems() []bench.WorkflowSystem {
	return []bench.WorkflowSystem{bench.RelayWorkflow{}, bench.RelayWorkflow{Eager: true},
		bench.RelayWorkflow{Start: "tx"}, bench.RelayWorkflow{Start: "many"}}
}
