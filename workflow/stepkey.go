package workflow

import (
	"context"
	"strconv"
)

// stepKeyCtx is the context key under which a step's function finds its
// idempotency key.
type stepKeyCtx struct{}

// StepIdempotencyKey is the idempotency key of the step whose function was
// given ctx (Step, StepTx, Go and compensations): the run's id and the
// step's key, "<run id>/<step key>" ("<run id>/<generation>/<step key>"
// after a ContinueAsNew, as child run ids are). It is the same on every
// attempt of the step, on every execution of the run, and after a rescue
// by another worker, so an outside service that deduplicates on it (an
// Idempotency-Key header) applies the step's effect once however often the
// step runs. Outside a step's function it is "".
//
// A run deleted and started again under the same id gets the same keys:
// give each business attempt a run id of its own.
func StepIdempotencyKey(ctx context.Context) string {
	k, _ := ctx.Value(stepKeyCtx{}).(string)
	return k
}

// stepIdempotencyKey is the key of step key in this execution's run.
func (x *execution) stepIdempotencyKey(key string) string {
	if x.run.generation > 0 {
		return x.runID + "/" + strconv.Itoa(x.run.generation) + "/" + key
	}
	return x.runID + "/" + key
}
