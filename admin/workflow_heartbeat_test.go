package admin

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// TestRunShowsHeartbeatsAndParentClose: a run's page shows each step's
// latest heartbeat (its attempt, time and details, kept across attempts)
// and each child's parent-close policy, where an operator reading the run
// looks; a child shows its own policy on its page too.
func TestRunShowsHeartbeatsAndParentClose(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := workflow.NewRegistry(b.pool, nil)
	side := workflow.MustRegister(reg, "side", func(wctx workflow.Context, in string) (string, error) { return in, nil })
	retry := &workflow.StepOpts{MaxAttempts: 3, Retry: core.Backoff{Base: time.Millisecond, Max: time.Millisecond}}
	upload := workflow.MustRegister(reg, "upload", func(wctx workflow.Context, in string) (string, error) {
		if _, err := workflow.Step(wctx, "chunks", func(ctx context.Context) (int, error) {
			done, _, err := workflow.HeartbeatDetails[int](ctx)
			if err != nil {
				return 0, err
			}
			if done == 0 {
				if err := workflow.Heartbeat(ctx, 3); err != nil {
					return 0, err
				}
				return 0, errors.New("connection reset after chunk 3")
			}
			return done, workflow.Heartbeat(ctx, done+1)
		}, retry); err != nil {
			return "", err
		}
		kept := workflow.Child(wctx, "kept", side, "a", &workflow.ChildOpts{ParentClose: workflow.ParentCloseAbandon})
		plain := workflow.Child(wctx, "plain", side, "b", nil)
		if _, err := kept.Get(wctx); err != nil {
			return "", err
		}
		return plain.Get(wctx)
	})
	ws := core.NewWorkers()
	if err := reg.AddWorkers(ws); err != nil {
		t.Fatal(err)
	}
	c, err := core.NewClient(b.pool, &core.Config{Workers: ws, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(context.Background()) }) //nolint:errcheck
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := workflow.Start(ctx, b.pool, upload, "x", &workflow.StartOpts{ID: "upload-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Result(ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	run := b.ok(b.do("GET", "/v1/workflows/runs/upload-1", b.ro, nil))
	var beat map[string]any
	for _, st := range run["steps"].([]any) {
		if m := st.(map[string]any); m["key"] == "chunks" {
			beat, _ = m["heartbeat"].(map[string]any)
		}
	}
	if beat == nil || beat["attempt"] != float64(2) || beat["details"] != float64(4) || beat["details_bytes"] != float64(1) || beat["at"] == nil {
		t.Fatalf("the chunks step's heartbeat: %v, want attempt 2's details 4", beat)
	}
	policy := map[string]any{}
	for _, ch := range run["children"].([]any) {
		m := ch.(map[string]any)
		policy[m["id"].(string)] = m["parent_close"]
	}
	if len(policy) != 2 || policy["upload-1/kept"] != "abandon" || policy["upload-1/plain"] != "cancel" {
		t.Fatalf("children's parent-close policies: %v, want kept abandon and plain cancel", policy)
	}
	child := b.ok(b.do("GET", "/v1/workflows/runs/upload-1%2Fkept", b.ro, nil))
	if child["parent_close"] != "abandon" {
		t.Fatalf("the abandoned child's own page: parent_close %v", child["parent_close"])
	}
	if run["parent_close"] != nil {
		t.Fatalf("a run that is no child shows parent_close %v", run["parent_close"])
	}
}
