package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
)

// ErrNotFound is returned for a schedule name that is not stored.
var ErrNotFound = errors.New("scheduler: no such schedule")

// ErrOwned is returned by Declare (and Start) for a schedule name that a live
// process of another namespace declares.
var ErrOwned = errors.New("scheduler: schedule owned by namespace")

// Info is a stored schedule as List reports it.
type Info struct {
	Name string
	// Namespace is the service that owns the schedule (Config.Namespace).
	Namespace string
	Spec      string
	TimeZone  string
	Kind      string
	Args      json.RawMessage
	Queue     string
	CatchUp   string
	Overlap   string
	// NextFireAt is the zero time when the stored one is an infinity
	// (written behind Declare); such a schedule is marked broken.
	NextFireAt time.Time
	LastFireAt *time.Time
	LastJobID  *int64
	Paused     bool
	// DisabledAt is set when no live process of the schedule's namespace
	// declares it any more; a disabled schedule does not fire.
	DisabledAt *time.Time
	// BrokenError is why a process could not evaluate the stored spec or
	// time zone (since BrokenAt); such processes leave the schedule to
	// others. The next fire by a process that can evaluate it clears both.
	BrokenError string
	BrokenAt    *time.Time
}

// List returns every stored schedule, by name.
func List(ctx context.Context, pool *pgxpool.Pool) ([]Info, error) {
	rows, err := pool.Query(ctx, sqlList)
	if err != nil {
		return nil, fmt.Errorf("scheduler: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Info, error) {
		var i Info
		var args string
		var broken *string
		// Stored times are read so that an infinity (written behind
		// Declare) costs its own field, not the whole list.
		var next, last, disabled, brokenAt pgtype.Timestamptz
		err := r.Scan(&i.Name, &i.Namespace, &i.Spec, &i.TimeZone, &i.Kind, &args, &i.Queue, &i.CatchUp, &i.Overlap,
			&next, &last, &i.LastJobID, &i.Paused, &disabled, &broken, &brokenAt)
		i.Args = json.RawMessage(args)
		i.NextFireAt, i.LastFireAt, i.DisabledAt, i.BrokenAt = next.Time, finite(last), finite(disabled), finite(brokenAt)
		if disabled.Valid && i.DisabledAt == nil {
			i.DisabledAt = &disabled.Time // an infinite disabled_at still disables
		}
		if broken != nil {
			i.BrokenError = *broken
		}
		return i, err
	})
	if err != nil {
		return nil, fmt.Errorf("scheduler: list: %w", err)
	}
	return out, nil
}

// Pause stops a schedule firing until Resume. It lasts across restarts and
// redeclarations.
func Pause(ctx context.Context, pool *pgxpool.Pool, name string) error {
	tag, err := pool.Exec(ctx, sqlPause, name)
	if err != nil {
		return fmt.Errorf("scheduler: pause %q: %w", name, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("scheduler: pause %q: %w", name, ErrNotFound)
	}
	return nil
}

// Resume lets a paused schedule fire again from its next fire time after
// now; the fires that fell in the pause are not caught up.
func Resume(ctx context.Context, pool *pgxpool.Pool, name string) error {
	return lockOne(ctx, pool, name, "resume", func(tx pgx.Tx, r *row, spec *Spec) error {
		_, err := tx.Exec(ctx, sqlResume, name, spec.Next(r.now))
		return err
	})
}

// TriggerNow enqueues the schedule's job at once, as an extra fire at the
// database's now() (recorded with outcome "triggered"). It does not move the
// schedule's next fire, and works on paused schedules too.
func TriggerNow(ctx context.Context, pool *pgxpool.Pool, name string) (core.EnqueueResult, error) {
	var res core.EnqueueResult
	err := lockOne(ctx, pool, name, "trigger", func(tx pgx.Tx, r *row, _ *Spec) error {
		recorded, err := recordFire(ctx, tx, name, r.now, "triggered")
		if err != nil {
			return err
		}
		if !recorded {
			return errors.New("triggered twice in one instant")
		}
		res.ID, err = enqueueFire(ctx, tx, r, r.now)
		return err
	})
	return res, err
}

// lockOne runs f in a transaction holding the named schedule's row.
func lockOne(ctx context.Context, pool *pgxpool.Pool, name, what string, f func(pgx.Tx, *row, *Spec) error) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlLockOne, name)
		if err != nil {
			return err
		}
		r, err := pgx.CollectExactlyOneRow(rows, scanRow)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		var cache specCache
		spec, err := cache.get(r.spec, r.timezone)
		if err != nil {
			return err
		}
		return f(tx, r, spec)
	})
	if err != nil {
		return fmt.Errorf("scheduler: %s %q: %w", what, name, err)
	}
	return nil
}
