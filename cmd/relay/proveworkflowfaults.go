package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/testkit/netfault"
	"github.com/relayq/relay/workflow"
)

// The faults and operator actions of `relay prove workflow`, and the loop
// that fires them while answering the runs' approval requests.

// cancelStages are the points of a payment run's path where --cancel-every
// cancels it, each target taking the next in turn: as soon as it is
// started, once charged, once a child's effect is written, while it waits
// for its approval, once notified (its last step: the cancel races the
// run's completion).
func cancelStages() []string { return []string{"started", "charged", "children", "asked", "notified"} }

// maxRetries bounds how often --retry-failed retries one run.
const maxRetries = 3

// wfFaultCounts are the faults and actions the proof actually made.
type wfFaultCounts struct {
	kills, pauses, partitions, pgRestarts, pgCrashes int
	backendKills, locks                              atomic.Int64
}

// wfSupervisor runs the proof's faults and operator actions.
type wfSupervisor struct {
	pool    *pgxpool.Pool
	fleet   *workerFleet
	db      *proofDB // its Cluster is nil without the throwaway cluster
	clock   *failoverClock
	proxies []*netfault.Proxy
	appName string
	c       proveWFConfig

	mu     sync.Mutex // counts' ints, written by background faults
	counts wfFaultCounts
}

// run answers the runs' approval requests, cancels the --cancel-every
// targets at their points, shows progress, fires the faults at evenly
// spaced points of the first 60% of the effects, and once they are over
// (the ledger back up) retries the failed runs. It returns once every run
// is final and none is left to retry, or stallBound after the last fault.
// A statement that fails (the faults include the database's) is tried
// again at the next turn; only ctx's end stops it.
func (s *wfSupervisor) run(ctx context.Context) error {
	c := s.c
	var faults []string
	if c.failover {
		faults = append(faults, "failover")
	}
	for range c.kills {
		faults = append(faults, "kill")
	}
	for range c.pauses {
		faults = append(faults, "pause")
	}
	for range c.partitions {
		faults = append(faults, "partition")
	}
	if c.pgRestart {
		faults = append(faults, "pg-restart")
	}
	if c.pgCrash {
		faults = append(faults, "pg-crash")
	}
	if c.backendKill > 0 {
		faults = append(faults, "backend-kill")
	}
	rand.Shuffle(len(faults), func(i, j int) { faults[i], faults[j] = faults[j], faults[i] })
	next := 0
	var background sync.WaitGroup // pauses, partitions, backend kills
	defer background.Wait()
	stormCtx, stopStorm := context.WithCancel(ctx)
	var storm sync.WaitGroup
	defer func() { stopStorm(); storm.Wait() }()
	if c.lockStorm {
		storm.Add(1)
		go func() {
			defer storm.Done()
			lockStorm(stormCtx, s.pool, workflow.RunKind, 2*c.lease, &s.counts.locks)
		}()
	}
	faultsDone := time.Time{}
	lastPrint, lastErr := time.Time{}, time.Time{}
	expected := s.expectedEffects()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("prove workflow: gave up: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		err := func() error {
			if err := s.cancelDue(ctx); err != nil {
				return err
			}
			if err := s.answerAsks(ctx); err != nil {
				return err
			}
			if !faultsDone.IsZero() && c.retryFailed {
				if err := s.retryFailed(ctx); err != nil {
					return err
				}
			}
			return nil
		}()
		var done, failed, outages, effects int
		if err == nil {
			err = s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state IN ('completed', 'failed', 'compensated', 'cancelled')),
				       count(*) FILTER (WHERE state = 'failed' AND (SELECT count(*) FROM prove_wf_retries t WHERE t.run_id = r.id) < $1),
				       count(*) FILTER (WHERE (input->>'outage')::boolean AND state NOT IN ('completed', 'failed', 'compensated', 'cancelled')),
				       (SELECT count(*) FROM prove_wf_effects)
				FROM relay_workflow_runs r WHERE workflow = 'prove.payment'`, maxRetries).Scan(&done, &failed, &outages, &effects)
		}
		if err != nil {
			// The database may be restarting under the prover's own
			// faults: try again at the next turn.
			if time.Since(lastErr) > 2*time.Second {
				fmt.Fprintf(os.Stderr, "prove workflow: %v (trying again)\n", err)
				lastErr = time.Now()
			}
			continue
		}
		s.clock.observe(done)
		if time.Since(lastPrint) > time.Second || done == c.runs {
			s.mu.Lock()
			fmt.Printf("prove: done %d/%d (failed %d)  kills %d/%d  pauses %d/%d  partitions %d/%d  restarts %d  backend kills %d  locks %d\n",
				done, c.runs, failed, s.counts.kills, c.kills, s.counts.pauses, c.pauses, s.counts.partitions, c.partitions,
				s.fleet.restarts(), s.counts.backendKills.Load(), s.counts.locks.Load())
			s.mu.Unlock()
			lastPrint = time.Now()
		}
		// The faults are over once each has fired and ended, the lock
		// storm has gone on to 60% of the effects too, and every outage
		// run has failed (the ledger outage is a fault too); then the
		// ledger comes back and the failed runs may be retried.
		if faultsDone.IsZero() && next == len(faults) && (!c.lockStorm || effects >= expected*6/10 || done == c.runs) && outages == 0 {
			background.Wait()
			stopStorm()
			storm.Wait()
			if err := retryDB(ctx, "workflow: bring the ledger back", func(ctx context.Context) error {
				_, err := s.pool.Exec(ctx, `UPDATE prove_wf_ledger SET down = false`)
				return err
			}); err != nil {
				return err
			}
			faultsDone = time.Now()
			fmt.Println("prove: the faults are over")
			continue // the retries come at the next turn
		}
		if done == c.runs && next < len(faults) {
			return fmt.Errorf("prove workflow: the runs finished before %d of the %d faults fired; use more runs", len(faults)-next, len(faults))
		}
		if done == c.runs && (failed == 0 || !c.retryFailed) && !faultsDone.IsZero() {
			// The targets whose point came with the last runs' end are
			// cancelled too (refused: finished), so that each is recorded.
			if err := s.cancelDue(ctx); err != nil {
				continue
			}
			return nil
		}
		if !faultsDone.IsZero() && time.Since(faultsDone) > c.stallBound {
			fmt.Printf("prove: %d runs not final (or failed) %s after the last fault\n", c.runs-done+failed, c.stallBound)
			return nil
		}
		// Faults fire by effects written (finished runs come in a rush at
		// the end of a run's path): fault i when they pass (i+1)/(faults+1)
		// of the first 60% of all the effects expected.
		if next < len(faults) && effects >= (next+1)*expected*6/10/(len(faults)+1) {
			if err := s.fire(ctx, faults[next], &background); err != nil {
				return err
			}
			next++
		}
	}
}

// expectedEffects is how many effects the runs write when all goes well
// (cancels write fewer).
func (s *wfSupervisor) expectedEffects() int {
	n := 0
	for seq := 0; seq < s.c.runs; seq++ {
		switch fail, outage, _ := s.c.cohort(seq); {
		case fail:
			n += 3 // payment, email, refund
		case outage:
			n += 2 // payment, credit
		default:
			n += 4 // payment, email, report, notify
		}
	}
	return n
}

// fire fires one fault; those that last (a pause, a partition, killed
// backends) go on in the background, in wg.
func (s *wfSupervisor) fire(ctx context.Context, fault string, wg *sync.WaitGroup) error {
	switch fault {
	case "kill":
		if err := s.fleet.kill(func(id string) error { return recordKill(ctx, s.pool, id) }); err != nil {
			return err
		}
		s.mu.Lock()
		s.counts.kills++
		s.mu.Unlock()
	case "pause":
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A worker stopped inside a transaction holding its run job's
			// row keeps it from being taken over: try another moment, a
			// few times.
			for try := 0; try < 10; try++ {
				if s.fleet.pause(ctx, s.pool) {
					s.mu.Lock()
					s.counts.pauses++
					s.mu.Unlock()
					return
				}
			}
			fmt.Fprintln(os.Stderr, "prove workflow: a pause was not exercised (no run taken over while its worker was stopped)")
		}()
	case "partition":
		wg.Add(1)
		go func() {
			defer wg.Done()
			for try := 0; try < 10; try++ {
				if s.partition(ctx) {
					s.mu.Lock()
					s.counts.partitions++
					s.mu.Unlock()
					return
				}
			}
			fmt.Fprintln(os.Stderr, "prove workflow: a partition was not exercised (no run taken over while its worker was cut off)")
		}()
	case "failover":
		if err := failover(ctx, s.db, s.clock, s.c.lag); err != nil {
			return err
		}
	case "pg-restart":
		fmt.Println("prove: restarting PostgreSQL")
		if err := s.db.Cluster.Restart(ctx); err != nil {
			return fmt.Errorf("prove workflow: restart PostgreSQL: %w", err)
		}
		s.mu.Lock()
		s.counts.pgRestarts++
		s.mu.Unlock()
	case "pg-crash":
		fmt.Println("prove: crashing PostgreSQL (immediate shutdown)")
		if err := s.db.Cluster.Crash(ctx); err != nil {
			return fmt.Errorf("prove workflow: crash PostgreSQL: %w", err)
		}
		s.mu.Lock()
		s.counts.pgCrashes++
		s.mu.Unlock()
	case "backend-kill":
		wg.Add(1)
		go func() {
			defer wg.Done()
			terminateBackends(ctx, s.pool, s.appName, s.c.backendKill, s.c.backendKillD, &s.counts.backendKills)
		}()
	}
	return nil
}

// partition cuts a worker executing a run off from PostgreSQL for
// --partition-for, and says whether the run was taken over meanwhile (its
// lease ended by a rescue): the cut-off worker's writes about it must then
// be refused. A cut whose worker held no run, or whose run was not taken
// over, tested nothing.
func (s *wfSupervisor) partition(ctx context.Context) bool {
	f := s.fleet
	f.partitioning.Lock() // one worker at a time: a partition, not an outage
	defer f.partitioning.Unlock()
	slot := f.pick(true) // kill and pause pick others meanwhile
	defer func() {
		f.mu.Lock()
		delete(f.paused, slot)
		f.mu.Unlock()
	}()
	f.mu.Lock()
	id := f.ids[slot]
	f.mu.Unlock()
	var jobID int64
	var token string
	deadline := time.Now().Add(5 * time.Second)
	for jobID == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		s.pool.QueryRow(ctx, `SELECT id, lease_token::text FROM relay_jobs WHERE state = 'claimed' AND attempted_by = $1 AND kind = $2
			ORDER BY id LIMIT 1`, id, workflow.RunKind).Scan(&jobID, &token) //nolint:errcheck // none yet: look again
		if jobID == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if jobID == 0 {
		fmt.Printf("prove: %s held no run to cut off with\n", id)
		return false
	}
	s.proxies[slot].Cut()
	fmt.Printf("prove: cut %s off from PostgreSQL for %s, holding job %d\n", id, s.c.partitionFor, jobID)
	select {
	case <-ctx.Done():
	case <-time.After(s.c.partitionFor):
	}
	var taken bool
	s.pool.QueryRow(ctx, `SELECT lease_token IS DISTINCT FROM $2::uuid FROM relay_jobs WHERE id = $1`, jobID, token).Scan(&taken) //nolint:errcheck // false then
	s.proxies[slot].Restore()
	fmt.Printf("prove: %s reconnected (job %d taken over: %t)\n", id, jobID, taken)
	return taken && ctx.Err() == nil
}

// answerAsks signals the runs that asked for their approval.
func (s *wfSupervisor) answerAsks(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT a.run_id FROM prove_wf_asks a
		WHERE NOT EXISTS (SELECT 1 FROM prove_wf_signals s WHERE s.run_id = a.run_id)`)
	if err != nil {
		return fmt.Errorf("read approval requests: %w", err)
	}
	asks, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read approval requests: %w", err)
	}
	for _, run := range asks {
		var seq int
		if _, err := fmt.Sscanf(run, "pay-%d", &seq); err != nil {
			return fmt.Errorf("approval request of %s: %w", run, err)
		}
		if err := proveSignal(ctx, s.pool, run, false, s.c.updated(seq)); err != nil {
			return err
		}
	}
	return nil
}

// cancelDue cancels the targets that reached their point. The cancel and
// its record are one transaction, so a cancel whose commit the prover did
// not see (a connection lost under a fault) is known by its record, and
// tried again otherwise. A target already finished is recorded as refused
// (workflow.ErrRunFinished), unless an earlier try was accepted.
func (s *wfSupervisor) cancelDue(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `
		SELECT t.run_id, t.stage FROM prove_wf_cancel_targets t
		WHERE NOT EXISTS (SELECT 1 FROM prove_wf_cancels c WHERE c.run_id = t.run_id)
		  AND CASE t.stage
		      WHEN 'started'  THEN true
		      WHEN 'charged'  THEN EXISTS (SELECT 1 FROM prove_wf_effects e WHERE e.run_id = t.run_id AND e.kind = 'payment')
		      WHEN 'children' THEN EXISTS (SELECT 1 FROM prove_wf_effects e WHERE e.run_id = t.run_id AND e.kind IN ('email', 'report'))
		      WHEN 'asked'    THEN EXISTS (SELECT 1 FROM prove_wf_asks a WHERE a.run_id = t.run_id)
		      WHEN 'notified' THEN EXISTS (SELECT 1 FROM prove_wf_effects e WHERE e.run_id = t.run_id AND e.kind = 'notify')
		      END`)
	if err != nil {
		return fmt.Errorf("read cancel targets: %w", err)
	}
	type target struct{ run, stage string }
	due, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (target, error) {
		var t target
		return t, r.Scan(&t.run, &t.stage)
	})
	if err != nil {
		return fmt.Errorf("read cancel targets: %w", err)
	}
	for _, t := range due {
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if err := workflow.Cancel(ctx, tx, t.run); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO prove_wf_cancels (run_id, stage, accepted) VALUES ($1, $2, true)`, t.run, t.stage)
			return err
		})
		if errors.Is(err, workflow.ErrRunFinished) {
			_, err = s.pool.Exec(ctx, `INSERT INTO prove_wf_cancels (run_id, stage, accepted, error) VALUES ($1, $2, false, $3)
				ON CONFLICT DO NOTHING`, t.run, t.stage, err.Error())
		}
		if err != nil {
			return fmt.Errorf("cancel %s: %w", t.run, err)
		}
	}
	return nil
}

// retryFailed retries the failed payment runs (each up to maxRetries
// times), each retry in one transaction with its record.
func (s *wfSupervisor) retryFailed(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT r.id FROM relay_workflow_runs r
		WHERE r.workflow = 'prove.payment' AND r.state = 'failed'
		  AND (SELECT count(*) FROM prove_wf_retries t WHERE t.run_id = r.id) < $1`, maxRetries)
	if err != nil {
		return fmt.Errorf("read failed runs: %w", err)
	}
	failed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read failed runs: %w", err)
	}
	for _, run := range failed {
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			var runErr string
			if err := tx.QueryRow(ctx, `SELECT coalesce(error, '') FROM relay_workflow_runs WHERE id = $1`, run).Scan(&runErr); err != nil {
				return err
			}
			if err := workflow.Retry(ctx, tx, run); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO prove_wf_retries (run_id, error) VALUES ($1, $2)`, run, runErr)
			return err
		})
		if errors.Is(err, workflow.ErrNotRetryable) {
			continue // no longer failed
		}
		if err != nil {
			return fmt.Errorf("retry %s: %w", run, err)
		}
	}
	return nil
}

// exercised fails the proof when a fault or action asked for did not
// happen as asked: a proof that passes without its fault proves nothing.
func (s *wfSupervisor) exercised(res map[string]int64) error {
	c, n := s.c, &s.counts
	var missing []string
	if n.kills < c.kills {
		missing = append(missing, fmt.Sprintf("--kill %d: %d kills", c.kills, n.kills))
	}
	if n.pauses < c.pauses {
		missing = append(missing, fmt.Sprintf("--pause %d: %d runs taken over from a stopped worker", c.pauses, n.pauses))
	}
	if n.partitions < c.partitions {
		missing = append(missing, fmt.Sprintf("--partition %d: %d runs taken over from a cut-off worker", c.partitions, n.partitions))
	}
	if c.pgRestart && n.pgRestarts == 0 {
		missing = append(missing, "--pg-restart: no restart")
	}
	if c.pgCrash && n.pgCrashes == 0 {
		missing = append(missing, "--pg-crash: no crash")
	}
	if c.backendKill > 0 && n.backendKills.Load() == 0 {
		missing = append(missing, "--backend-kill: no worker connection terminated")
	}
	if c.lockStorm && n.locks.Load() == 0 {
		missing = append(missing, "--lock-storm: no run job locked")
	}
	if c.cancelEvery > 0 && res["cancels_accepted"] == 0 {
		missing = append(missing, "--cancel-every: no cancel accepted")
	}
	if c.retryFailed && res["retried"] == 0 {
		missing = append(missing, "--retry-failed: no run retried")
	}
	if len(missing) > 0 {
		return fmt.Errorf("prove workflow: faults asked for were not exercised: %v", missing)
	}
	return nil
}
