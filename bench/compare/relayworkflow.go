package main

import "github.com/relayq/relay/internal/bench"

// relayWorkflowSystems is Relay's side of the workflow workloads (none
// until the workflow package lands).
func relayWorkflowSystems() []bench.WorkflowSystem { return nil }
