package admin

import (
	"context"
	"net/http"

	"github.com/danielgtaylor/huma/v2"

	"github.com/relayq/relay/workflow"
)

type runHistoryOutput struct {
	Body *workflow.History
}

// registerHistory registers GET /v1/workflows/runs/{id}/history: a run's
// history in the export format workflow.Replay reads (docs/workflow.md,
// "History export"), read from the primary (a history is replayed against
// new code: it must be the run's latest).
func (s *server) registerHistory(api huma.API) {
	o := op("get-workflow-run-history", http.MethodGet, "/v1/workflows/runs/{id}/history",
		"Export a run's history (format version 1), for workflow.Replay", "workflows")
	o.Description = "The run (workflow, state, input, output, error) and every checkpoint of its current generation by position " +
		"(key, kind, state, output, error and its stored description, attempts, wake-up, child, times, attempt log), " +
		"as workflow.ReadHistory returns it. `format` is the version; `step_count` the number of steps exported."
	huma.Register(api, o, func(ctx context.Context, in *runIDInput) (*runHistoryOutput, error) {
		h, err := workflow.ReadHistory(ctx, s.pool, in.ID)
		if err != nil {
			return nil, s.runError("export workflow run history", in.ID, err)
		}
		return &runHistoryOutput{Body: h}, nil
	})
}
