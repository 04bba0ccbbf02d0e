// Package bench is the harness behind `relay bench` and the side-by-side
// comparison in bench/compare: workloads (burn-down, steady rate), worker
// processes, a fixed-memory latency histogram, and CPU accounting for
// PostgreSQL and the workers. A queue under test is a System; Relay's is
// here, River's lives in the comparison module so that this module does not
// depend on River.
//
// It is a harness, not part of Relay's API: its names change whenever a
// benchmark needs them to. It lives outside internal/ because two modules
// run it — cmd/relay and the comparison module in bench/compare — and no
// internal/ directory is visible to both; internal/ holds only what the
// library is built on.
package bench

import (
	"context"
	"crypto/sha256"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// System is a job queue under test. Every job it inserts carries a stamp
// (Unix nanoseconds) that its handler hands to Hooks.Started.
type System interface {
	// Name is a short lowercase name ("relay").
	Name() string
	// Describe says how the system is configured for cfg, for the output.
	Describe(cfg WorkerConfig) string
	// Table is the job table, for ANALYZE and VACUUM.
	Table() string
	// Setup creates or migrates the system's tables in pool's schema.
	Setup(ctx context.Context, pool *pgxpool.Pool) error
	// Reset empties the job table.
	Reset(ctx context.Context, pool *pgxpool.Pool) error
	// InsertBatch inserts n jobs in one batch, stamped now.
	InsertBatch(ctx context.Context, pool *pgxpool.Pool, n int) error
	// InsertOne inserts one job stamped with stamp, in its own transaction.
	InsertOne(ctx context.Context, pool *pgxpool.Pool, stamp time.Time) error
	// FillFinished inserts n jobs that are already finished (successfully).
	FillFinished(ctx context.Context, pool *pgxpool.Pool, n int) error
	// EndToEnd returns percentiles of created → finalized over the finished
	// jobs, from the table.
	EndToEnd(ctx context.Context, pool *pgxpool.Pool) (p50, p95, p99 time.Duration, err error)
	// Work runs a client with cfg.Workers slots until ctx is done, then stops
	// it gracefully.
	Work(ctx context.Context, pool *pgxpool.Pool, cfg WorkerConfig, hooks Hooks) error
}

// WorkerConfig shapes one worker process.
type WorkerConfig struct {
	// Workers is the number of jobs the process runs at once.
	Workers int
	// Prefetch is how many jobs beyond Workers a system may hold claimed
	// (Relay's QueueConfig.Prefetch; systems without it ignore it).
	Prefetch int
	// Job is what each handler does.
	Job Job
	// ClaimCoalesce is Relay's Config.ClaimCoalesce (0: the default;
	// negative: off). Other systems ignore it.
	ClaimCoalesce time.Duration
	// Window, when set, has each process also report pickup latencies per
	// window of this length, by the job's insert time (Steady.Window).
	Window time.Duration
	// NoClaimFloor turns Relay's claim floor off (core.Config.NoClaimFloor),
	// for A/B runs.
	NoClaimFloor bool
	// SynchronousClaims makes Relay's claims commit synchronously
	// (core.Config.SynchronousClaims), for A/B runs.
	SynchronousClaims bool
	// Queues, when above 1, has each process serve that many queues ("q0"
	// … "q<n-1>", Relay.Queues), each with Workers/Queues slots (at least
	// one), instead of the default queue.
	Queues int
	// StartEarly starts each process's client before the run's clock
	// (Hooks.Ready): a steady run offers jobs to running workers. A
	// burn-down times the workers' start with the drain, as before.
	StartEarly bool
}

// Job is the handler's work: sleep, then hash.
type Job struct {
	Sleep time.Duration
	// Hash is rounds of SHA-256 over the previous digest.
	Hash int
}

// Do performs the work and returns how long it took.
func (j Job) Do() time.Duration {
	start := time.Now()
	if j.Sleep > 0 {
		time.Sleep(j.Sleep)
	}
	var sum [32]byte
	for i := 0; i < j.Hash; i++ {
		sum = sha256.Sum256(sum[:])
	}
	sink.Store(uint32(sum[0]))
	return time.Since(start)
}

var sink atomic.Uint32 // keeps the hashing from being optimised away

// Hooks are how a System reports to the harness.
type Hooks struct {
	// Started is called as a handler starts, with the job's stamp.
	Started func(stamp int64)
	// KeyedStarted, when set, is called first thing in the handler of a
	// job with an ordering key, with the job's id and the time the handler
	// started by this process's clock: the order check compares it with the
	// commit of the key's previous job (Relay.OrderViolations).
	KeyedStarted func(id int64, at time.Time)
	// Worked is called with how long Job.Do took: the handler's own time,
	// which bounds what any queue can reach.
	Worked func(time.Duration)
	// Completed is called with the number of completions the system has
	// recorded durably so far (a running total).
	Completed func(total int64)
	// Ready is called once, when the system's client has started and is
	// listening for new jobs. With WorkerConfig.StartEarly the parent
	// starts its clock, and its inserts, only when every worker process
	// is ready, so that a run does not measure the processes' start (new
	// connections cost this VM's PostgreSQL tens of milliseconds of CPU
	// each).
	Ready func()
}

func (h Hooks) ready() {
	if h.Ready != nil {
		h.Ready()
	}
}

// CallReady calls h.Ready, if set.
func (h Hooks) CallReady() { h.ready() }
