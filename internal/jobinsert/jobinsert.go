// Package jobinsert lets Relay's own layers insert a core job inside a
// statement of theirs (a CTE that writes their row and its job in one
// round trip) without duplicating the core's insert: package core fills in
// these functions when it is initialised, with its own validation, column
// list, tracing and counting. It is internal: the contract may change with
// the core.
package jobinsert

import "context"

// Job is one job prepared for insertion.
type Job struct {
	// Ctx carries the job's producer span.
	Ctx context.Context
	// Row is the job as the statement of SQL reads it (a JSON array of one
	// core enqueue row), to pass as its parameter.
	Row string
	// Done ends the producer span and counts the job once the statement
	// ran: id is the job's id, err the statement's error.
	Done func(id int64, err error)
	// Wake wakes the workers of the job's queue (unless the job runs
	// later), after a statement of SQLAfter inserted it and committed, on
	// db, the handle it ran on: as core.Enqueue does for an enqueue that is
	// its own transaction.
	Wake func(ctx context.Context, db any)
}

var (
	// Prepare validates a job as core.Enqueue does (args a core.JobArgs,
	// opts a *core.EnqueueOpts; unique jobs are refused) and starts its
	// producer span under ctx.
	Prepare func(ctx context.Context, args, opts any) (Job, error)
	// SQL returns the body of a CTE, INSERT … RETURNING id, that inserts
	// the job of parameter $param with the id in column idCol of the
	// relation from (a CTE of one row or none: no row, no job). It is the
	// core's own enqueue statement, so the insert goes through
	// relay_jobs' triggers and rules as any enqueue's.
	SQL func(from, idCol string, param int) string
	// SQLAfter is SQL for a statement that is its own transaction (on a
	// pool or connection, not in a caller's transaction): its insert sends
	// no wake-up at commit, since PostgreSQL serialises the commits of
	// transactions that NOTIFY; call Job.Wake after the statement instead.
	SQLAfter func(from, idCol string, param int) string
)
