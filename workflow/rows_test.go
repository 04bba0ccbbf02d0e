package workflow_test

import (
	"context"
	"errors"
	"testing"

	"github.com/relayq/relay/workflow"
)

// A run that fails with an empty error text still ends with an error: the
// admin API finds failed, compensated and cancelled runs by it (partial
// index relay_workflow_runs_error_idx), so a run without one would be
// missing from the failed runs' list and count.
func TestFailedRunWithEmptyErrorHasOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := workflow.MustRegister(b.reg, "mute", func(wctx workflow.Context, _ int) (int, error) {
		return 0, errors.New("")
	})
	b.start()
	if _, err := workflow.Start(ctx, b.pool, wf, 1, &workflow.StartOpts{ID: "mute-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := result[int](t, b.pool, "mute-1"); err == nil {
		t.Fatal("the run did not fail")
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'mute-1' AND state = 'failed' AND error <> ''`); n != 1 {
		t.Fatalf("the failed run has no error text (%d rows)", n)
	}
}
