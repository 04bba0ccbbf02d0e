// Package wfhook is how the test environment (package workflowtest)
// reaches into the workflow engine: its virtual clock, its step fakes, its
// fake workflows and its crash points, carried on the context of the
// core.Client that executes the environment's runs. The engine reads the
// hooks once per execution; a production context carries none, and every
// hook is then skipped by a nil check.
package wfhook

import (
	"context"
	"errors"
	"time"
)

// Hooks are a test environment's ways into an execution. Every field may be
// nil.
type Hooks struct {
	// Now is the clock of workflow.Now and of the steps' attempt log.
	Now func() time.Time
	// Step returns the fake that replaces the function of step key of run
	// (its output encoded as JSON), or nil to run the real one.
	Step func(runID, key string) func(ctx context.Context) ([]byte, error)
	// Workflow returns a fake of the workflow name, a
	// func(workflow.Context, []byte) ([]byte, error) (typed as any: the
	// engine's Context lives in the package that imports this one), or nil.
	Workflow func(name string) any
	// Crash reports whether the execution of run dies at point p of step
	// key, as a worker killed there would.
	Crash func(runID, key string, p Point) bool
}

// Point is where around a step a simulated crash happens.
type Point int

const (
	// BeforeStep is after every earlier checkpoint committed, before the
	// step's function runs.
	BeforeStep Point = iota
	// AfterStep is after the step's function returned, before what it
	// returned is checkpointed (a StepTx's transaction has committed).
	AfterStep
)

// ErrCrashed is the error of an execution stopped by a simulated crash.
var ErrCrashed = errors.New("workflowtest: the worker crashed here (simulated)")

type ctxKey struct{}

// With returns ctx carrying h.
func With(ctx context.Context, h *Hooks) context.Context {
	return context.WithValue(ctx, ctxKey{}, h)
}

// From returns the hooks ctx carries, or nil.
func From(ctx context.Context) *Hooks {
	h, _ := ctx.Value(ctxKey{}).(*Hooks)
	return h
}
