package core

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
)

// Cancel cancels a queued or running job. A running job's lease ends at once,
// so its worker can record nothing more; the worker is told to stop through a
// notification (delivered when db's transaction commits) and, failing that,
// at its next heartbeat. Cancelling a job in any other state is
// ErrIllegalTransition; an unknown id is ErrNotFound.
func Cancel(ctx context.Context, db DB, id int64) error {
	ex, err := execerFor(db)
	if err != nil {
		return err
	}
	var queue, orderingKey, token string
	if err := transition(ctx, ex, sqlCancel, id, StateCancelled, func(r scanner) error { return r.Scan(&queue, &orderingKey, &token) }); err != nil {
		return fmt.Errorf("core: cancel job %d: %w", id, err)
	}
	if _, err := ex.Exec(ctx, sqlNotifyCancel, strconv.FormatInt(id, 10), token); err != nil {
		return fmt.Errorf("core: cancel job %d: notify workers: %w", id, err)
	}
	if orderingKey != "" {
		// The next job of the key may run now.
		if _, err := ex.Exec(ctx, sqlNotifyQueue, queue); err != nil {
			return fmt.Errorf("core: cancel job %d: notify workers: %w", id, err)
		}
	}
	return nil
}

// Requeue puts a dead or cancelled job back in its queue, runnable now, with
// its attempts reset. Its history is kept. Requeueing a job in any other state
// is ErrIllegalTransition; an unknown id is ErrNotFound.
func Requeue(ctx context.Context, db DB, id int64) error {
	ex, err := execerFor(db)
	if err != nil {
		return err
	}
	var queue string
	if err := transition(ctx, ex, sqlRequeue, id, StateQueued, func(r scanner) error { return r.Scan(&queue) }); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "relay_jobs_unique_idx" {
			err = ErrUniqueConflict
		}
		return fmt.Errorf("core: requeue job %d: %w", id, err)
	}
	if _, err := ex.Exec(ctx, sqlNotifyQueue, queue); err != nil {
		return fmt.Errorf("core: requeue job %d: notify workers: %w", id, err)
	}
	return nil
}

// transition runs a state-changing statement for one job and, when it
// changed nothing, says why: no such job, or a state it may not leave for
// `to`.
func transition(ctx context.Context, ex execer, sql string, id int64, to JobState, scan func(scanner) error) error {
	changed := false
	err := ex.Query(ctx, sql, []any{id}, func(r scanner) error { changed = true; return scan(r) })
	if err != nil {
		return err
	}
	if changed {
		return nil
	}
	var state string
	found := false
	if err := ex.Query(ctx, sqlJobState, []any{id}, func(r scanner) error { found = true; return r.Scan(&state) }); err != nil {
		return err
	}
	if !found {
		return ErrNotFound
	}
	return fmt.Errorf("%w: %s → %s", ErrIllegalTransition, state, to)
}

// JobGet reads one job; ErrNotFound if there is none with that id. A
// timestamp stored as infinity or -infinity (possible only for rows written
// behind the API before the row rules refused them) reads as the zero
// time.
func JobGet(ctx context.Context, db DB, id int64) (*JobRow, error) {
	ex, err := execerFor(db)
	if err != nil {
		return nil, err
	}
	var j *JobRow
	err = ex.Query(ctx, sqlGetJob, []any{id}, func(r scanner) error {
		var err error
		j, err = scanJobRow(r)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("core: get job %d: %w", id, err)
	}
	if j == nil {
		return nil, fmt.Errorf("core: get job %d: %w", id, ErrNotFound)
	}
	return j, nil
}

// BlockedKey is an ordering key held up by a dead job: the jobs after it
// wait until it is requeued (Requeue) or cancelled (Cancel).
type BlockedKey struct {
	Queue string
	Key   string
	// JobID is the dead job at the head of the key.
	JobID int64
	// Waiting counts the key's later jobs not yet finished.
	Waiting int64
}

// BlockedKeys lists up to limit blocked ordering keys of queue ("" for
// every queue), oldest first.
func BlockedKeys(ctx context.Context, db DB, queue string, limit int) ([]BlockedKey, error) {
	ex, err := execerFor(db)
	if err != nil {
		return nil, err
	}
	var out []BlockedKey
	err = ex.Query(ctx, sqlBlockedKeys, []any{queue, limit}, func(r scanner) error {
		var b BlockedKey
		if err := r.Scan(&b.Queue, &b.Key, &b.JobID, &b.Waiting); err != nil {
			return err
		}
		out = append(out, b)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("core: blocked keys: %w", err)
	}
	return out, nil
}
