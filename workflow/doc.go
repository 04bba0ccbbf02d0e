// Package workflow will hold Relay's durable workflows: multi-step flows in
// which each step is a core job, step outputs are stored and handed to the
// steps that depend on them, completing a step and enqueuing its ready
// dependants is one transaction, and one trace spans the whole run.
//
// Not built yet; see docs/design.md.
package workflow
