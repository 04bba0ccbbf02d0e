package admin

import "github.com/danielgtaylor/huma/v2"

// registerWorkflows is the place of the workflow endpoints (/v1/workflows/…):
// list runs by name, state and time; a run with its step timeline and child
// runs; cancel, retry from the failed step, send a signal. They land with
// the workflow package; follow the jobs endpoints' shapes (op(), a cursor of
// kind "workflow-runs", s.change for every write so it is audited).
func (s *server) registerWorkflows(api huma.API) {
	// WORKFLOW ENDPOINTS GO HERE.
}
