package core

import (
	"context"
	"fmt"
	"time"
)

// Queue pauses. A paused queue keeps its jobs but no worker process claims
// them: the claim statement (sqlClaim) checks relay_queue_pauses, so every
// client honours a pause at its next claim — within one poll interval, and
// usually at once, since each claim runs the check. Jobs already running
// finish normally. The statements live here rather than in queries.go to keep
// the feature in one file.

const (
	sqlPauseQueue = `
INSERT INTO relay_queue_pauses (queue, paused_by) VALUES ($1, $2)
ON CONFLICT (queue) DO NOTHING`
	sqlResumeQueue  = `DELETE FROM relay_queue_pauses WHERE queue = $1`
	sqlPausedQueues = `SELECT queue, paused_at, paused_by FROM relay_queue_pauses ORDER BY queue`
)

// QueuePause is a paused queue.
type QueuePause struct {
	Queue    string
	PausedAt time.Time
	// PausedBy is who paused it, as given to PauseQueue.
	PausedBy string
}

// PauseQueue pauses queue: no worker claims its jobs until ResumeQueue. It
// reports whether the queue was running before (false when it was already
// paused). by names who paused it, for operators. db may be a transaction.
func PauseQueue(ctx context.Context, db DB, queue, by string) (bool, error) {
	if queue == "" {
		return false, &ValidationError{Field: "queue", Reason: "must not be empty"}
	}
	ex, err := execerFor(db)
	if err != nil {
		return false, err
	}
	n, err := ex.Exec(ctx, sqlPauseQueue, queue, by)
	if err != nil {
		return false, fmt.Errorf("core: pause queue %q: %w", queue, err)
	}
	return n == 1, nil
}

// ResumeQueue resumes a paused queue and wakes its workers (when db's
// transaction commits). It reports whether the queue was paused.
func ResumeQueue(ctx context.Context, db DB, queue string) (bool, error) {
	ex, err := execerFor(db)
	if err != nil {
		return false, err
	}
	n, err := ex.Exec(ctx, sqlResumeQueue, queue)
	if err != nil {
		return false, fmt.Errorf("core: resume queue %q: %w", queue, err)
	}
	if n == 0 {
		return false, nil
	}
	if _, err := ex.Exec(ctx, sqlNotifyQueue, queue); err != nil {
		return false, fmt.Errorf("core: resume queue %q: notify workers: %w", queue, err)
	}
	return true, nil
}

// PausedQueues lists the paused queues, by name.
func PausedQueues(ctx context.Context, db DB) ([]QueuePause, error) {
	ex, err := execerFor(db)
	if err != nil {
		return nil, err
	}
	var out []QueuePause
	err = ex.Query(ctx, sqlPausedQueues, nil, func(r scanner) error {
		var p QueuePause
		if err := r.Scan(&p.Queue, &p.PausedAt, &p.PausedBy); err != nil {
			return err
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("core: paused queues: %w", err)
	}
	return out, nil
}
