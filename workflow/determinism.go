package workflow

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
)

// record returns the value checkpointed at key, or computes it with fn and
// checkpoints it: a value made once per run and replayed after.
func record[T any](wctx Context, primitive, kind, key string, fn func() T) T {
	x := wctx.x
	if x.enter(primitive) != nil {
		var zero T
		return zero // the run fails (enter)
	}
	x.userKey(kind, key)
	pos, h := x.next(kind, key)
	if h != nil && h.state == stepCompleted {
		var v T
		if err := json.Unmarshal([]byte(h.output), &v); err != nil {
			x.fatal(fmt.Errorf("workflow: run %s: decode recorded %s %q into %T: %w", x.runID, kind, key, v, err))
		}
		return v
	}
	x.checkCancel()
	v := fn()
	enc, err := encode(kind+" "+key, v)
	if err != nil {
		x.fatal(fmt.Errorf("workflow: run %s: %w", x.runID, err))
	}
	x.later(&stepRow{position: pos, key: key, kind: kind, state: stepCompleted, output: string(enc)})
	return v
}

// Now returns the current time, recorded under key the first time and the
// same on every replay: branch on Now, never on time.Now.
func Now(wctx Context, key string) time.Time {
	return record(wctx, "Now", "value", key, func() time.Time { return wctx.x.clock().UTC() })
}

// Random returns a random uint64, recorded under key once and replayed.
func Random(wctx Context, key string) uint64 {
	return record(wctx, "Random", "value", key, rand.Uint64)
}

// UUID returns a random UUID (v4), recorded under key once and replayed:
// an idempotency key for an outside call made by a later step, say.
func UUID(wctx Context, key string) uuid.UUID {
	return record(wctx, "UUID", "value", key, uuid.New)
}

// Patch lets new code take a new path while runs started on the old code
// replay the old one. Wrap the changed code:
//
//	if workflow.Patch(wctx, "send-sms") {
//		... new steps ...
//	} else {
//		... the old steps, as they were ...
//	}
//
// A run that reaches the patch for the first time on the new code (a new
// run, or an old one past the history it had) records it and gets true; a
// run whose history holds, at this position, what the old code did gets
// false and replays the old path. Once no run of the old code is in flight,
// delete the else branch and keep the Patch call (see docs/workflow.md).
//
// A name may guard several places of the workflow: every call of it in a
// run answers as the first did (a run on the old path keeps to it), and
// only the first takes a position in history.
func Patch(wctx Context, name string) bool {
	x := wctx.x
	if x.enter("Patch") != nil {
		return false // the run fails (enter)
	}
	if v, seen := x.patches[name]; seen {
		return v
	}
	v := patch(x, name)
	x.patches[name] = v
	return v
}

func patch(x *execution, name string) bool {
	key := "patch:" + name
	if h := x.hist[x.pos]; h != nil && (h.kind != "patch" || h.key != key) {
		return false // history took the old path here: no position used
	}
	pos, h := x.next("patch", key)
	if h != nil {
		return true
	}
	x.checkCancel()
	x.later(&stepRow{position: pos, key: key, kind: "patch", state: stepCompleted, output: "true"})
	return true
}
