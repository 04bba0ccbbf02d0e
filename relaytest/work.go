package relaytest

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
)

// WorkOpts configure Work. The zero value (or nil) runs attempt 1 of 25 of
// a job in queue "default" that exists only in memory.
type WorkOpts struct {
	// DB, when set (a test's transaction, usually), makes the job real:
	// Work enqueues it there, claims it as a client would (attempt 1, a
	// lease token), runs the worker and, when the worker returns nil
	// without having called core.CompleteTx, records its success. A worker
	// that calls core.CompleteTx needs this. On an error the job is left
	// claimed, for the test to inspect.
	DB core.DB
	// Enqueue are the options the job is made with (DB set) or described by
	// (queue, priority, max attempts, metadata, tags).
	Enqueue *core.EnqueueOpts
	// Attempt is the attempt the worker sees without DB (default 1).
	Attempt int
}

// Work runs w on one job of args as a client would, without a client: the
// args go through JSON (as stored), the worker's Timeout applies, and a
// panic comes back as a *core.PanicError. It returns the worker's error.
// t fails only when the job cannot be set up.
func Work[T core.JobArgs](ctx context.Context, t testing.TB, w core.Worker[T], args T, opts *WorkOpts) error {
	t.Helper()
	if opts == nil {
		opts = &WorkOpts{}
	}
	encoded, err := json.Marshal(args)
	if err != nil {
		t.Fatalf("relaytest: encode %T: %v", args, err)
	}
	job := &core.Job[T]{}
	if err := json.Unmarshal(encoded, &job.Args); err != nil {
		t.Fatalf("relaytest: decode %T from its own encoding %s: %v", args, encoded, err)
	}
	if opts.DB != nil {
		job.JobRow = claim(ctx, t, opts.DB, args, opts.Enqueue)
	} else {
		job.JobRow = inMemory(args, encoded, opts)
	}
	if tw, ok := w.(interface {
		Timeout(*core.JobRow) time.Duration
	}); ok {
		if d := tw.Timeout(job.JobRow); d > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeoutCause(ctx, d, fmt.Errorf("core: job timed out after %s", d))
			defer cancel()
		}
	}
	err = run(ctx, w, job)
	if err != nil || opts.DB == nil {
		return err
	}
	// Success: record it unless the worker did (core.CompleteTx).
	after, gerr := core.JobGet(ctx, opts.DB, job.ID)
	if gerr != nil {
		t.Fatalf("relaytest: read job %d after its worker: %v", job.ID, gerr)
	}
	if after.State == core.StateClaimed {
		if cerr := core.CompleteTx(ctx, opts.DB, job); cerr != nil {
			t.Fatalf("relaytest: record success of job %d: %v", job.ID, cerr)
		}
	}
	return nil
}

func run[T core.JobArgs](ctx context.Context, w core.Worker[T], job *core.Job[T]) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &core.PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return w.Work(ctx, job)
}

// inMemory describes a job that was never stored.
func inMemory(args core.JobArgs, encoded []byte, opts *WorkOpts) *core.JobRow {
	now := time.Now()
	row := &core.JobRow{
		ID: 0, Kind: args.Kind(), Queue: core.DefaultQueue, State: core.StateClaimed,
		Attempt: max(opts.Attempt, 1), MaxAttempts: core.DefaultMaxAttempts,
		RunAt: now, CreatedAt: now, AttemptedAt: now, AttemptedBy: "relaytest",
		EncodedArgs: encoded, Metadata: json.RawMessage(`{}`), LeaseToken: uuid.New(),
	}
	if o := opts.Enqueue; o != nil {
		if o.Queue != "" {
			row.Queue = o.Queue
		}
		if o.Priority != nil {
			row.Priority = *o.Priority
		}
		if o.MaxAttempts != 0 {
			row.MaxAttempts = o.MaxAttempts
		}
		if len(o.Metadata) > 0 {
			row.Metadata, _ = json.Marshal(o.Metadata)
		}
		row.Tags, row.OrderingKey = o.Tags, o.OrderingKey
	}
	return row
}

// claim enqueues args in db and claims the job as a client would.
func claim(ctx context.Context, t testing.TB, db core.DB, args core.JobArgs, opts *core.EnqueueOpts) *core.JobRow {
	t.Helper()
	res, err := core.Enqueue(ctx, db, args, opts)
	if err != nil {
		t.Fatalf("relaytest: enqueue %T: %v", args, err)
	}
	if res.Duplicate {
		t.Fatalf("relaytest: enqueue %T: a duplicate of unique job %d", args, res.ID)
	}
	ex, err := dbx.For(db)
	if err != nil {
		t.Fatalf("relaytest: %v", err)
	}
	token := uuid.New()
	n, err := ex.Exec(ctx, sqlClaim, res.ID, token.String())
	if err != nil || n != 1 {
		t.Fatalf("relaytest: claim job %d: %d rows, %v", res.ID, n, err)
	}
	row, err := core.JobGet(ctx, db, res.ID)
	if err != nil {
		t.Fatalf("relaytest: %v", err)
	}
	row.LeaseToken = token
	return row
}
