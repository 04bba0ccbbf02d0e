package main

import (
	"context"
	"fmt"
)

// runsHistory is `relay runs history ID`: the run's history export, the
// admin API's GET /v1/workflows/runs/{id}/history as it answers, in JSON
// whatever --output says (it is a file format: workflow.DecodeHistories
// reads one or several, concatenated, for workflow.Replay).
func runsHistory() opCommand {
	return opCommand{name: "history", args: []string{"ID"},
		summary: "print a run's history export (JSON, versioned) for workflow.Replay: relay runs history ID > ID.json",
		run: func(ctx context.Context, c *opCall) error {
			b, err := c.api.call(ctx, "GET", "/v1/workflows/runs/"+segment(c.args[0])+"/history", nil, nil, nil)
			if err != nil {
				return err
			}
			if _, err := c.w.Write(b); err != nil {
				return err
			}
			if len(b) == 0 || b[len(b)-1] != '\n' {
				fmt.Fprintln(c.w)
			}
			return nil
		}}
}
