package core

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/relayq/relay/internal/eager"
)

// Worker runs jobs of one kind. Work returns nil on success. An error fails
// the attempt: the job is retried after the retry policy's delay, or ends dead
// when its attempts run out (or at once for an error wrapped by Permanent;
// RetryIn picks the delay). A panic is recovered and fails the attempt with
// its stack.
//
// ctx is cancelled when the job's lease is lost (it was cancelled, or its
// lease expired and it was rescued), when its timeout passes, and when the
// client stops before the job finished; context.Cause tells which.
//
// A Worker may also implement, optionally:
//
//	Timeout(job *JobRow) time.Duration             // per-attempt limit; 0 = none
//	RetryDelay(attempt int, err error) time.Duration // per-kind RetryPolicy
type Worker[T JobArgs] interface {
	Work(ctx context.Context, job *Job[T]) error
}

// WorkFunc adapts a function to a Worker.
type WorkFunc[T JobArgs] func(ctx context.Context, job *Job[T]) error

// Work calls f.
func (f WorkFunc[T]) Work(ctx context.Context, job *Job[T]) error { return f(ctx, job) }

// Workers maps job kinds to the workers that run them. Build one with
// NewWorkers and AddWorker, then hand it to a Client.
type Workers struct {
	byKind     map[string]*registration
	middleware []Middleware
}

// registration is one kind's worker with its type erased.
type registration struct {
	work    func(ctx context.Context, row *JobRow) error
	timeout func(row *JobRow) time.Duration
	retry   RetryPolicy
	// attach hands the worker each client's eager inserter (a worker
	// implementing eager.Attacher), nil otherwise.
	attach func(client any, ins eager.Inserter[JobArgs, *EnqueueOpts, *JobRow])
}

// NewWorkers returns an empty set of workers.
func NewWorkers() *Workers { return &Workers{byKind: map[string]*registration{}} }

// AddWorker registers w for the kind of T (taken from T's zero value, so
// Kind must not depend on field values). Registering a kind twice is an
// error.
func AddWorker[T JobArgs](ws *Workers, w Worker[T]) error {
	var zero T
	kind := zero.Kind()
	if err := validateKind(kind, zero); err != nil {
		return fmt.Errorf("core: add worker: %w", err)
	}
	if _, dup := ws.byKind[kind]; dup {
		return fmt.Errorf("core: add worker: kind %q is already registered", kind)
	}
	handle := func(ctx context.Context, row *JobRow) error {
		var args T
		if bytes.Equal(bytes.TrimSpace(row.EncodedArgs), []byte("null")) {
			// json.Unmarshal takes null as "leave args zero": the handler
			// would run on zero values. Enqueue never writes it.
			return fmt.Errorf("core: decode args of %s job %d into %T: args are JSON null, not an object", row.Kind, row.ID, args)
		}
		if err := json.Unmarshal(row.EncodedArgs, &args); err != nil {
			return fmt.Errorf("core: decode args of %s job %d into %T: %w", row.Kind, row.ID, args, err)
		}
		return w.Work(ctx, &Job[T]{JobRow: row, Args: args})
	}
	reg := &registration{
		work: func(ctx context.Context, row *JobRow) error { return ws.chain(ctx, row, handle) },
	}
	if t, ok := w.(interface{ Timeout(*JobRow) time.Duration }); ok {
		reg.timeout = t.Timeout
	}
	if r, ok := w.(RetryPolicy); ok {
		reg.retry = r
	}
	if a, ok := w.(eager.Attacher[JobArgs, *EnqueueOpts, *JobRow]); ok {
		reg.attach = a.AttachEager
	}
	ws.byKind[kind] = reg
	return nil
}

// MustAddWorker is AddWorker that panics on error, for registration at
// start-up.
func MustAddWorker[T JobArgs](ws *Workers, w Worker[T]) {
	if err := AddWorker(ws, w); err != nil {
		panic(err)
	}
}

// Kinds lists the registered kinds.
func (ws *Workers) Kinds() []string {
	kinds := make([]string, 0, len(ws.byKind))
	for k := range ws.byKind {
		kinds = append(kinds, k)
	}
	return kinds
}
