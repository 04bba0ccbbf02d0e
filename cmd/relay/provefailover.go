package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/devpg"
	"github.com/relayq/relay/testkit/netfault"
)

// A proof's --failover runs on two throwaway clusters: a primary and a
// streaming standby of it (synchronous or asynchronous replication), which
// every connection of the proof reaches through one multi-host URL with
// target_session_attrs=read-write. Mid-run the prover stops the primary as
// a crash would (-m immediate) and promotes the standby; the workers, the
// producers and the prover's own connections find the new primary through
// the same URL.

// startFailoverPair starts the primary and its standby and returns the
// multi-host URL reaching whichever is the primary.
func startFailoverPair(ctx context.Context, db *proofDB, replication string) (string, error) {
	sync, err := parseReplication(replication)
	if err != nil {
		return "", err
	}
	fmt.Printf("prove: starting a primary and a streaming standby (%s replication, fsync on)\n", replication)
	primary, err := devpg.Start(ctx, devpg.Options{})
	if err != nil {
		return "", err
	}
	db.closers = append(db.closers, func() { primary.Stop() }) //nolint:errcheck
	// The standby streams through a proxy that --replication-lag cuts.
	link, err := netfault.Listen(fmt.Sprintf("127.0.0.1:%d", primary.Port))
	if err != nil {
		return "", fmt.Errorf("prove: %w", err)
	}
	db.closers = append(db.closers, func() { link.Close() }) //nolint:errcheck
	db.standbyLink = link
	standby, err := devpg.StartStandby(ctx, primary, devpg.StandbyOptions{Synchronous: sync, Via: link.Addr()})
	if err != nil {
		return "", err
	}
	db.closers = append(db.closers, func() { standby.Stop() }) //nolint:errcheck
	db.Cluster, db.Standby = primary, standby
	return devpg.MultiHostURL(primary, standby), nil
}

func parseReplication(s string) (sync bool, err error) {
	switch s {
	case "sync":
		return true, nil
	case "async":
		return false, nil
	}
	return false, fmt.Errorf("prove: --replication must be sync or async, not %q", s)
}

// failoverClock measures a failover: from the primary's stop until work
// resumes, that is until the first job or run finishes on the new primary
// (the count of finished ones, read on it, passes the first count read on
// it).
type failoverClock struct {
	mu       sync.Mutex
	stopped  time.Time     // the primary was stopped
	promoted time.Duration // after stopped, the standby accepted writes
	baseline int           // the first count read after the promotion; -1 before it
	resumed  time.Duration // after stopped; 0 until work resumed
}

// failover stops db's primary (immediate shutdown) and promotes its
// standby, timing both on clock. With lag, the standby's link to the
// primary (a proxy) is cut for that long first, the primary killed while
// it is cut, and what the link held dropped: a standby that far behind, as
// over a slow link. The primary goes on committing meanwhile (with
// synchronous replication its commits wait for the standby).
func failover(ctx context.Context, db *proofDB, clock *failoverClock, lag time.Duration) error {
	if lag > 0 {
		db.standbyLink.Cut()
		fmt.Printf("\nprove: failover: the standby's link to the primary cut for %s (replication lag)\n", lag)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(lag):
		}
	}
	fmt.Println("\nprove: failover: stopping the primary (-m immediate), promoting the standby")
	clock.mu.Lock()
	clock.stopped, clock.baseline = time.Now(), -1
	clock.mu.Unlock()
	if err := db.Cluster.Kill(ctx); err != nil {
		return fmt.Errorf("prove: failover: %w", err)
	}
	if lag > 0 {
		// What the standby had not received is gone with the primary.
		db.standbyLink.Close()
	}
	if err := db.Standby.Promote(ctx); err != nil {
		return fmt.Errorf("prove: failover: %w", err)
	}
	clock.mu.Lock()
	clock.promoted = time.Since(clock.stopped)
	clock.mu.Unlock()
	fmt.Printf("prove: failover: the standby accepts writes %.2fs after the primary stopped\n", clock.promoted.Seconds())
	return nil
}

// observe is given each count of finished jobs or runs the prover reads.
func (c *failoverClock) observe(finished int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped.IsZero() || c.promoted == 0 || c.resumed != 0 {
		return
	}
	if c.baseline < 0 {
		c.baseline = finished
		return
	}
	if finished > c.baseline {
		c.resumed = time.Since(c.stopped)
		fmt.Printf("prove: failover: work resumed %.2fs after the primary stopped\n", c.resumed.Seconds())
	}
}

// summary is the failover's part of a proof's summary line.
func (c *failoverClock) summary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("promoted_after=%.2fs resumed_after=%.2fs", c.promoted.Seconds(), c.resumed.Seconds())
}

// retryDB runs f until it succeeds, for at most a minute: the prover's own
// reads and writes outlive a failover (its pool reconnects through the
// multi-host URL to the new primary) or a restart.
func retryDB(ctx context.Context, what string, f func(ctx context.Context) error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := f(attemptCtx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("prove: %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("prove: %s: %w", what, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// proofProducer enqueues the queue proof's jobs over the run, as an
// application's producer does, so that enqueues commit around the
// failover. Each batch is retried until it commits (the jobs are unique by
// their sequence number, in every state, so a retried batch whose first
// commit did succeed inserts nothing twice); acked are the sequence numbers
// whose commit was acknowledged, which the audit looks for afterwards.
type proofProducer struct {
	mu      sync.Mutex
	acked   []int
	retries int
	done    chan struct{}
	err     error
}

// produceProofJobs starts the producer: c.jobs jobs in batches of 10, at
// 80% of the fleet's nominal capacity.
func produceProofJobs(ctx context.Context, pool *pgxpool.Pool, c proveConfig) *proofProducer {
	p := &proofProducer{done: make(chan struct{})}
	const batch = 10
	interval := c.jobTime * 5 / 4 * batch / time.Duration(c.processes*c.concurrency)
	go func() {
		defer close(p.done)
		start := time.Now()
		for seq, i := 0, 0; seq < c.jobs; i++ {
			if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
				select {
				case <-ctx.Done():
					p.err = ctx.Err()
					return
				case <-time.After(wait):
				}
			}
			n := min(batch, c.jobs-seq)
			params := make([]core.EnqueueParams, n)
			for j := range params {
				ms := int(float64(c.jobTime.Milliseconds()) * (0.5 + rand.Float64()))
				params[j] = core.EnqueueParams{Args: proveArgs{Seq: seq + j, Ms: ms}, Opts: &core.EnqueueOpts{
					Queue: proveQueue, MaxAttempts: 100,
					Unique: &core.UniqueOpts{Key: fmt.Sprint("seq-", seq+j), States: []core.JobState{
						core.StateQueued, core.StateClaimed, core.StateSucceeded, core.StateDead, core.StateCancelled}},
				}}
			}
			tries := 0
			err := retryDB(ctx, "enqueue", func(ctx context.Context) error {
				tries++
				_, err := core.EnqueueMany(ctx, pool, params)
				return err
			})
			if err != nil {
				p.err = err
				return
			}
			p.mu.Lock()
			p.retries += tries - 1
			for j := range n {
				p.acked = append(p.acked, seq+j)
			}
			p.mu.Unlock()
			seq += n
		}
	}()
	return p
}

// ackedCount is how many enqueues were acknowledged so far.
func (p *proofProducer) ackedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked)
}

// finished says whether every job was enqueued; it returns the producer's
// error if it gave up.
func (p *proofProducer) finished() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// lostEnqueues counts the jobs whose enqueue was acknowledged but which
// are not in the database: committed on a primary, not yet on the standby
// that replaced it.
func (p *proofProducer) lostEnqueues(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	p.mu.Lock()
	acked := append([]int(nil), p.acked...)
	p.mu.Unlock()
	var lost int64
	err := retryDB(ctx, "audit lost enqueues", func(ctx context.Context) error {
		return pool.QueryRow(ctx, `SELECT count(*) FROM unnest($1::int[]) AS a(seq)
			WHERE NOT EXISTS (SELECT 1 FROM relay_jobs WHERE kind = 'prove.job' AND (args->>'seq')::int = a.seq)`, acked).Scan(&lost)
	})
	return lost, err
}

// sinkCalls is the workflow proof's sink record under --failover: in the
// prover's memory, where no failover can lose it.
type sinkCalls struct {
	mu                sync.Mutex
	runs, kinds, toks []string
	ats               []time.Time
}

func (s *sinkCalls) add(run, kind, token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs, s.kinds, s.toks, s.ats = append(s.runs, run), append(s.kinds, kind), append(s.toks, token), append(s.ats, time.Now())
}

// store replaces the sink's table with the record, for the audit.
func (s *sinkCalls) store(ctx context.Context, pool *pgxpool.Pool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return retryDB(ctx, "store the sink's record", func(ctx context.Context) error {
		_, err := pool.Exec(ctx, `WITH gone AS (DELETE FROM prove_wf_sink)
			INSERT INTO prove_wf_sink (run_id, kind, token, at) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[])`,
			s.runs, s.kinds, s.toks, s.ats)
		return err
	})
}

var errFailoverNeedsCluster = errors.New("prove: --failover needs the throwaway clusters (omit --database-url)")
