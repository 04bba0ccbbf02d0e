// Package eager lets a layer above core insert a job already claimed by a
// core.Client and run it in the caller's goroutine, with no queue hop (no
// NOTIFY, no claim, no hand-over to an executor): the workflow layer's
// eager start is built on it, after Temporal's Eager Workflow Start.
//
// core implements Inserter; a worker registered with core.AddWorker that
// implements Attacher is handed each client's Inserter when the client is
// made (core.NewClient), so the machinery stays out of core's public API
// and no package-level state joins the two.
package eager

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayq/relay/internal/jobinsert"
)

var (
	// ErrUnavailable: the client cannot take an eager job now (no free
	// worker slot on the queue, or the client is not running: not started,
	// or stopping). Nothing was written; enqueue the job instead.
	ErrUnavailable = errors.New("core: eager execution unavailable")
	// ErrNotWorked: the client does not serve the job's queue or has no
	// worker for its kind, so it cannot claim the job. Nothing was written.
	ErrNotWorked = errors.New("core: this client does not work that queue or kind")
	// ErrNotClaimed: Execute was called on a job not claimed for the
	// caller (left queued by a paused queue or a global limit), or a
	// second time.
	ErrNotClaimed = errors.New("core: the job is not claimed by this caller")
)

// Job is a job claimed for an eager caller (Claim, Lent.Adopt), Row its
// claimed attempt (a *core.JobRow).
type Job[Row any] struct {
	// ID is the job's id.
	ID int64
	// Row is the claimed attempt, nil when the job was not claimed for
	// the caller: it then waits for a worker like any enqueued job.
	Row Row
	// Execute runs the claimed job in the caller's goroutine, through the
	// client's worker path (the kind's worker and middleware, its Timeout
	// and RetryPolicy, the attempt's span and metrics, the outcome recorded
	// under the lease fence), and returns the handler's error. Call it
	// exactly once for a claimed job: it holds one of its queue's worker
	// slots until then. ctx bounds the caller's wait: when it ends first,
	// the handler is cancelled with core.ErrCallerGone and the attempt goes
	// back to the queue uncounted.
	Execute func(ctx context.Context) error
}

// Inserter inserts jobs claimed by one core.Client: Args is core.JobArgs,
// Opts *core.EnqueueOpts, Row *core.JobRow.
type Inserter[Args, Opts, Row any] interface {
	// Claim claims job id, already in the queue (queued, never attempted,
	// of kind on queue), for the client, as the fetch loop would claim it
	// (state claimed, attempt 1, a fresh lease token, the client's
	// LeaseDuration), in one statement: a job that is not so (claimed by another worker
	// meanwhile, say), or that a pause or a global limit holds, is not
	// claimed (ErrUnavailable; nothing written). lend is the caller's own
	// job, a handler of the client's running on queue, which waits for
	// the claimed job: the claimed job runs in lend's worker slot instead
	// of one of its own, so the queue runs no more jobs at once than
	// before (lend's handler is blocked in Execute). A lend that is not
	// in flight in this client, or on another queue, is ErrNotWorked.
	Claim(ctx context.Context, id int64, kind, queue string, lend Row) (Job[Row], error)
	// Lend reserves lend's worker slot (as Claim lends it) for a job of
	// kind on queue that the caller inserts itself, already claimed by the
	// client, in a statement of its own (jobinsert.SQLIntoClaimed, with
	// the Lent's By, Token and LeaseMS): one row version where an insert
	// and Claim write two. It refuses what Claim refuses, writing nothing
	// (ErrNotWorked, ErrUnavailable). The caller then calls exactly one of
	// the Lent's Adopt (the insert committed the job claimed) or Release
	// (it did not: left queued by a pause or a limit, not inserted, or
	// failed). Stop waits for the reservation until then. With lend nil
	// (the zero Row) the job takes a worker slot of its queue's own
	// (ErrUnavailable when none is free or the client is
	// not running), freed when its Execute returns or at Release: the
	// eager start's way (workflow.RunNow). Ordering keys, unique jobs and
	// a delay or future run-at belong to the queue: the insert
	// (SQLIntoClaimed) inserts such a job queued.
	Lend(ctx context.Context, kind, queue string, lend Row) (*Lent[Row], error)
	// Producer is the client's telemetry for the jobs of its enqueues, for
	// a job the caller inserts on the client's behalf without a reservation
	// (an eager start that fell back to a queued one), counted and spanned
	// as a Lent's job is.
	Producer() Producer
}

// Producer is a client's telemetry for the jobs it enqueues: its tracer
// provider and relay.jobs.enqueued counter (nil: the global ones), which
// jobinsert.BeginFor takes.
type Producer struct {
	TracerProvider trace.TracerProvider
	Enqueued       metric.Int64Counter
}

// Lent is a worker slot Inserter.Lend reserved for a job the caller
// inserts claimed.
type Lent[Row any] struct {
	// By is the claiming worker's id (attempted_by), Token the attempt's
	// lease token, LeaseMS the lease's length in milliseconds.
	By      string
	Token   uuid.UUID
	LeaseMS int64
	// Producer is the client's (Inserter.Producer): the caller's insert
	// is the client's enqueue (jobinsert.BeginFor), spanned and counted as
	// its own are.
	Producer
	// Adopt makes job id, committed claimed with By and Token, a job in
	// flight of the client from then on (its lease renewed, Stop waiting
	// for it), to Execute once: row is the job as the caller inserted it,
	// at its attempted_at (the inserting statement's now()). ctx's values
	// go to the job's handler, as Claim's do.
	Adopt func(ctx context.Context, id int64, row jobinsert.Row, at time.Time) Job[Row]
	// Release gives the reservation back, for a job not committed claimed.
	Release func()
}

// Attacher is implemented by a worker that wants the Inserter of every
// client made with it: core.NewClient calls Attach with the client (a
// *core.Client, to key by) and its Inserter.
type Attacher[Args, Opts, Row any] interface {
	AttachEager(client any, ins Inserter[Args, Opts, Row])
}
