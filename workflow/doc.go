// Package workflow runs durable, code-first workflows on Relay's job table.
//
// A workflow is a plain Go function registered by name:
//
//	reg := workflow.NewRegistry(pool, nil)
//	pay := workflow.MustRegister(reg, "payment", func(wctx workflow.Context, o Order) (Receipt, error) {
//		charge, err := workflow.StepTx(wctx, "charge", func(ctx context.Context, tx pgx.Tx) (Charge, error) {
//			return chargeCard(ctx, tx, o) // its writes commit with the checkpoint
//		}, nil)
//		if err != nil {
//			return Receipt{}, err
//		}
//		workflow.Compensate(wctx, "refund", func(ctx context.Context) error { return refund(ctx, charge) })
//		if err := workflow.Sleep(wctx, "cool-off", time.Minute); err != nil {
//			return Receipt{}, err
//		}
//		return workflow.Step(wctx, "email", func(ctx context.Context) (Receipt, error) { return sendReceipt(ctx, charge) }, nil)
//	})
//	reg.AddWorkers(workers) // then run a core.Client with those workers
//	h, _ := workflow.Start(ctx, tx, pay, order, nil) // joins the caller's transaction
//	receipt, err := h.Result(ctx, pool)
//
// A run is a row of relay_workflow_runs; executing it is a core job of kind
// relay.workflow, so leases, heartbeats, the rescuer and retries all apply.
// Each execution calls the function from the top and replays it: a step
// already checkpointed returns its stored output instead of running again.
// Every checkpoint commits only while the execution's attempt holds the run
// job's lease (the lease fence), so a paused or partitioned worker that comes
// back late can record nothing and cannot fork the run.
//
// Sleeps, waits for signals or children and a step's retry delay end the
// execution with core.Snooze: the run job is queued again for later without
// spending an attempt. Only executions that crash or fail count against the
// run's attempts.
//
// See docs/workflow.md for the model, the determinism rules, versioning and
// failure semantics of every primitive.
package workflow
