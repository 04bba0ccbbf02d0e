package workflow_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/workflow"
)

type settlement struct {
	Month string `json:"month"`
}

// The start hook: a StartKind job (what a schedule's fire enqueues) starts
// one run, named after the job, whatever its retries; an outbox
// subscription of StartKind starts one run per event, with the event's
// payload as input.
func TestStartHooks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	workflow.MustRegister(b.reg, "settle", func(wctx workflow.Context, s settlement) (string, error) {
		return workflow.Step(wctx, "close-books", func(ctx context.Context) (string, error) { return "settled " + s.Month, nil }, nil)
	})
	b.start()

	// A schedule's job (scheduler.Schedule{Args: workflow.StartArgs{...}}).
	res, err := core.Enqueue(ctx, b.pool, workflow.StartArgs{Workflow: "settle", Input: json.RawMessage(`{"month":"2026-11"}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := "settle-job-" + itoa(int(res.ID))
	b.waitFor("the scheduled run", func() bool { return b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1`, id) == 1 })
	if out, err := result[string](t, b.pool, id); err != nil || out != "settled 2026-11" {
		t.Fatal(out, err)
	}

	// An outbox subscription.
	d, err := outbox.NewDispatcher(b.pool, &outbox.Config{Subscriptions: []outbox.Subscription{{
		Topic: "month.closed", Kind: workflow.StartKind, Opts: &core.EnqueueOpts{Metadata: workflow.StartMetadata("settle")},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := outbox.Publish(ctx, b.pool, outbox.Event{Topic: "month.closed", Payload: settlement{Month: "2026-12"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.DispatchOnce(ctx); err != nil {
		t.Fatal(err)
	}
	id = "settle-event-" + itoa(int(ev))
	b.waitFor("the event's run", func() bool { return b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = $1`, id) == 1 })
	if out, err := result[string](t, b.pool, id); err != nil || out != "settled 2026-12" {
		t.Fatal(out, err)
	}

	// An unregistered workflow: a start job is put back without spending an
	// attempt while it is young (a rolling deploy: a process that knows the
	// workflow may come), and dies once it is old; nothing started.
	bad, _ := core.Enqueue(ctx, b.pool, workflow.StartArgs{Workflow: "nope"}, nil)
	b.waitFor("the young start job put back", func() bool {
		return b.count(`SELECT count(*) FROM relay_jobs WHERE id = $1 AND state = 'queued' AND attempt = 0 AND run_at > now()`, bad.ID) == 1
	})
	if _, err := b.pool.Exec(ctx, `UPDATE relay_jobs SET created_at = now() - interval '2 hours', run_at = now() WHERE id = $1`, bad.ID); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the old start job to die", func() bool {
		j, err := core.JobGet(ctx, b.pool, bad.ID)
		return err == nil && j.State == core.StateDead
	})
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE workflow = 'nope'`); n != 0 {
		t.Fatal("an unregistered workflow started")
	}
}

// StartArgs.FireTimeKey: a schedule's fire starts the run
// "<workflow>:<schedule>:<fire time>" with the fire time in its input; the
// same fire started again is the same run; input that is not a JSON object
// fails the start job for good.
func TestStartHookFireTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	type in struct {
		Ledger string `json:"ledger"`
		Fired  string `json:"fired"`
	}
	workflow.MustRegister(b.reg, "close", func(wctx workflow.Context, i in) (string, error) {
		return workflow.Step(wctx, "close", func(ctx context.Context) (string, error) { return i.Ledger + "@" + i.Fired, nil }, nil)
	})
	b.start()

	args := workflow.StartArgs{Workflow: "close", Input: json.RawMessage(`{"ledger":"main"}`), FireTimeKey: "fired"}
	meta := map[string]any{"relay.schedule": "month-end", "relay.fire_time": "2026-11-30T07:00:00Z"}
	id := "close:month-end:2026-11-30T07:00:00Z"
	var jobs []int64
	for range 2 { // the fire, then the same fire again
		res, err := core.Enqueue(ctx, b.pool, args, &core.EnqueueOpts{Metadata: meta})
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, res.ID)
	}
	for _, j := range jobs {
		b.waitFor("the start job", func() bool {
			row, err := core.JobGet(ctx, b.pool, j)
			return err == nil && row.State == core.StateSucceeded
		})
	}
	if out, err := result[string](t, b.pool, id); err != nil || out != "main@2026-11-30T07:00:00Z" {
		t.Fatal(out, err)
	}
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE workflow = 'close'`); n != 1 {
		t.Fatalf("%d runs for one fire started twice", n)
	}

	args.Input = json.RawMessage(`[1]`)
	bad, err := core.Enqueue(ctx, b.pool, args, &core.EnqueueOpts{Metadata: map[string]any{"relay.fire_time": "2026-12-31T07:00:00Z"}})
	if err != nil {
		t.Fatal(err)
	}
	b.waitFor("the bad start job to die", func() bool {
		j, err := core.JobGet(ctx, b.pool, bad.ID)
		return err == nil && j.State == core.StateDead
	})
	if n := b.count(`SELECT count(*) FROM relay_workflow_runs WHERE workflow = 'close'`); n != 1 {
		t.Fatal("a start with bad input started a run")
	}
}

// A start job that can never start its run (its id is another workflow's
// run) dies at once with that error instead of retrying it.
func TestStartHookDeterministicErrorIsPermanent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	settle := workflow.MustRegister(b.reg, "settle", func(wctx workflow.Context, s settlement) (string, error) { return s.Month, nil })
	workflow.MustRegister(b.reg, "other", func(wctx workflow.Context, _ int) (int, error) { return 0, nil })
	if _, err := workflow.Start(ctx, b.pool, settle, settlement{Month: "x"}, &workflow.StartOpts{ID: "taken"}); err != nil {
		t.Fatal(err)
	}
	b.start()
	bad, err := core.Enqueue(ctx, b.pool, workflow.StartArgs{Workflow: "other", ID: "taken", Input: json.RawMessage(`1`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.waitFor("the start job to die", func() bool {
		j, err := core.JobGet(ctx, b.pool, bad.ID)
		return err == nil && j.State == core.StateDead && j.Attempt == 1
	})
}
