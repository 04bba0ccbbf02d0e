// Package core is Relay's job queue: a leased job table in PostgreSQL, an
// enqueue that joins the caller's transaction, and a worker runtime that
// claims jobs in batches with FOR UPDATE SKIP LOCKED, fences every write with
// a lease token, renews leases with heartbeats, rescues expired leases,
// retries failures with exponential backoff and jitter, and keeps jobs that
// exhaust their attempts as dead letters.
//
// Delivery is at-least-once: a worker can finish a job and die before its
// success is recorded, and the job then runs again. Handlers must be
// idempotent. The one exactly-once effect is a database write made in the
// transaction that records the job's success (see CompleteTx).
//
// A job's life is the state machine of docs/state-machine.md: queued →
// claimed → succeeded, with retries (claimed → queued), dead letters
// (claimed → dead), requeue (dead|cancelled → queued) and cancellation
// (queued|claimed → cancelled). The database refuses any other transition.
package core
