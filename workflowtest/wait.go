package workflowtest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// sqlBusy: is anything of the environment's queues running or due? A
// claimed job is an execution under way (or its outcome not yet recorded);
// a due queued job is about to be claimed; a wake-up handed off over a held
// row is about to be made.
const sqlBusy = `
SELECT EXISTS (SELECT 1 FROM relay_jobs WHERE queue = ANY($1) AND (state = 'claimed' OR (state = 'queued' AND run_at <= now())))
    OR EXISTS (SELECT 1 FROM relay_job_rewake)`

// sqlNextTimer is the next instant something of the environment's queues
// waits for: a sleep's or a signal timeout's wake_at, a step's retry, a
// run's execution timeout (deadline_at), or a queued job's run_at (an execution's retry, a job of the code under test)
// — but not the run_at of a run waiting without deadline (a signal without
// timeout, a child), which is only the engine's poll for a lost wake-up.
const sqlNextTimer = `
SELECT min(t) FROM (
  SELECT s.wake_at AS t
  FROM relay_workflow_steps s JOIN relay_workflow_runs r ON r.id = s.run_id
  WHERE r.state IN ('pending', 'running', 'compensating') AND s.state IN ('waiting', 'retrying') AND s.wake_at > now()
  UNION ALL
  SELECT deadline_at FROM relay_workflow_runs
  WHERE state IN ('pending', 'running', 'compensating') AND deadline_at > now()
  UNION ALL
  SELECT j.run_at
  FROM relay_jobs j
  WHERE j.state = 'queued' AND j.queue = ANY($1) AND j.run_at > now()
    AND NOT EXISTS (SELECT 1 FROM relay_workflow_runs r JOIN relay_workflow_steps s ON s.run_id = r.id
                    WHERE r.job_id = j.id AND r.state IN ('pending', 'running', 'compensating')
                      AND s.state = 'waiting' AND s.wake_at IS NULL)
) timers`

// sqlDueJobs are the queued jobs due once the clock moved: due by run_at,
// or the jobs of runs whose timer or deadline is due (a snooze's run_at is
// a moment past its wake_at).
const sqlDueJobs = `
SELECT j.id FROM relay_jobs j
WHERE j.state = 'queued' AND j.queue = ANY($1)
  AND (j.run_at <= now()
       OR EXISTS (SELECT 1 FROM relay_workflow_runs r JOIN relay_workflow_steps s ON s.run_id = r.id
                  WHERE r.job_id = j.id AND s.state IN ('waiting', 'retrying') AND s.wake_at <= now())
       OR EXISTS (SELECT 1 FROM relay_workflow_runs r
                  WHERE r.job_id = j.id AND r.state IN ('pending', 'running', 'compensating') AND r.deadline_at <= now()))`

// sqlBlocked describes the runs in flight: each with its queue and its
// last step.
const sqlBlocked = `
SELECT r.id, r.workflow, r.state, r.queue, coalesce(s.kind || ' ' || s.key || ' (' || s.state || ')', 'no step yet')
FROM relay_workflow_runs r
LEFT JOIN LATERAL (SELECT kind, key, state FROM relay_workflow_steps WHERE run_id = r.id ORDER BY position DESC LIMIT 1) s ON true
WHERE r.state IN ('pending', 'running', 'compensating')
ORDER BY r.created_at, r.id
LIMIT 20`

// poll is how often Wait looks whether the executions under way are done.
const poll = 2 * time.Millisecond

// Wait drives the environment until run id ends, and returns the run
// (workflow.Get: its state, output, error and steps). Whenever nothing is
// running or due, it moves the virtual clock to the next timer (a sleep, a
// signal's timeout, a step's retry, an event of SignalAt or At) and wakes
// what is due then. It fails the test when the run can never end (every
// run in flight waits for a signal or a child that nothing will bring) or
// Config.Timeout passes in wall time.
func (e *Env) Wait(id string) *workflow.Run {
	e.t.Helper()
	e.start()
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	for {
		var state string
		err := e.pool.QueryRow(ctx, `SELECT state FROM relay_workflow_runs WHERE id = $1`, id).Scan(&state)
		if err != nil {
			e.t.Fatalf("workflowtest: wait for run %s: %v", id, err)
			return nil
		}
		if workflow.RunState(state).Final() {
			run, err := workflow.Get(ctx, e.pool, id)
			if err != nil {
				e.t.Fatalf("workflowtest: %v", err)
			}
			return run
		}
		var busy bool
		if err := e.pool.QueryRow(ctx, sqlBusy, e.queues).Scan(&busy); err != nil {
			e.t.Fatalf("workflowtest: wait for run %s: %s%v", id, e.blocked(), err)
			return nil
		}
		if busy {
			select {
			case <-ctx.Done():
				e.t.Fatalf("workflowtest: run %s did not end within %s of wall time (virtual clock at %s)%s",
					id, e.cfg.Timeout, e.Now().Format(time.RFC3339), e.blocked())
				return nil
			case <-time.After(poll):
			}
			continue
		}
		if err := e.advance(ctx); err != nil {
			e.t.Fatalf("workflowtest: run %s cannot end: %v%s", id, err, e.blocked())
			return nil
		}
	}
}

// Settle runs what is due at the virtual clock's present (and what that
// makes due), until nothing runs or is due: every run in flight then waits
// for a timer, a signal or a child. The clock does not move.
func (e *Env) Settle() {
	e.t.Helper()
	e.start()
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	for {
		if ev := e.dueEvent(); ev != nil {
			if err := ev.do(ctx, e.pool); err != nil {
				e.t.Fatalf("workflowtest: %s at %s: %v", ev.what, ev.at.Format(time.RFC3339), err)
			}
			continue
		}
		var busy bool
		if err := e.pool.QueryRow(ctx, sqlBusy, e.queues).Scan(&busy); err != nil {
			e.t.Fatalf("workflowtest: settle: %v", err)
			return
		}
		if !busy {
			return
		}
		select {
		case <-ctx.Done():
			e.t.Fatalf("workflowtest: executions still running after %s of wall time%s", e.cfg.Timeout, e.blocked())
			return
		case <-time.After(poll):
		}
	}
}

// advance runs the events due, or moves the clock to the next timer and
// wakes what is due then. Nothing is running or due when it is called.
func (e *Env) advance(ctx context.Context) error {
	if ev := e.dueEvent(); ev != nil {
		if err := ev.do(ctx, e.pool); err != nil {
			e.t.Fatalf("workflowtest: %s at %s: %v", ev.what, ev.at.Format(time.RFC3339), err)
		}
		return nil
	}
	next, err := e.next(ctx)
	if err != nil {
		return err
	}
	if next == nil {
		return fmt.Errorf("nothing runs, and no timer or event of the environment will wake a run in flight (virtual clock at %s)", e.Now().Format(time.RFC3339))
	}
	return e.moveTo(ctx, *next)
}

// next is the next timer or event, nil when there is none.
func (e *Env) next(ctx context.Context) (*time.Time, error) {
	var next *time.Time
	if err := e.pool.QueryRow(ctx, sqlNextTimer, e.queues).Scan(&next); err != nil {
		return nil, fmt.Errorf("read the next timer: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.events) > 0 && (next == nil || e.events[0].at.Before(*next)) {
		at := e.events[0].at
		next = &at
	}
	return next, nil
}

// moveTo moves the clock to at and wakes the jobs due then.
func (e *Env) moveTo(ctx context.Context, at time.Time) error {
	e.setClock(ctx, at)
	rows, err := e.pool.Query(ctx, sqlDueJobs, e.queues)
	if err != nil {
		return fmt.Errorf("read the jobs due: %w", err)
	}
	due, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("read the jobs due: %w", err)
	}
	for _, id := range due {
		// The production wake-up: the job's run_at is the (virtual) present
		// and the queue's workers are notified.
		if err := core.Wake(ctx, e.pool, id); err != nil {
			return err
		}
	}
	return nil
}

// AdvanceBy moves the virtual clock d forward, running what comes due on
// the way, timer after timer (events of SignalAt and At included), and
// returns once nothing runs or is due at the new time: a test then reads
// the state of a run in flight ("a day in, the reminder went and the run
// still waits").
func (e *Env) AdvanceBy(d time.Duration) {
	e.t.Helper()
	target := e.Now().Add(d)
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	for {
		e.Settle()
		next, err := e.next(ctx)
		if err != nil {
			e.t.Fatalf("workflowtest: advance: %v", err)
			return
		}
		if next == nil || next.After(target) {
			if err := e.moveTo(ctx, target); err != nil {
				e.t.Fatalf("workflowtest: advance: %v", err)
			}
			e.Settle()
			return
		}
		if err := e.moveTo(ctx, *next); err != nil {
			e.t.Fatalf("workflowtest: advance: %v", err)
			return
		}
	}
}

// dueEvent takes the first event whose time the clock has reached.
func (e *Env) dueEvent() *event {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.events) == 0 || e.events[0].at.After(e.Now()) {
		return nil
	}
	ev := e.events[0]
	e.events = e.events[1:]
	return ev
}

// blocked describes the runs in flight, for a failure's message.
func (e *Env) blocked() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := e.pool.Query(ctx, sqlBlocked)
	if err != nil {
		return "\n  (runs in flight unreadable: " + err.Error() + ")"
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id, wf, state, queue, last string
		if rows.Scan(&id, &wf, &state, &queue, &last) != nil {
			break
		}
		served := ""
		if _, ok := e.cfg.Queues[queue]; !ok {
			served = ", a queue the environment does not serve (Config.Queues)"
		}
		fmt.Fprintf(&b, "\n  run %s (%s) %s on queue %q%s, last step: %s", id, wf, state, queue, served, last)
	}
	return b.String()
}
