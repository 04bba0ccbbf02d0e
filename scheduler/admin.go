package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
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

// List returns every stored schedule, by name. db is any core.DB.
func List(ctx context.Context, db core.DB) ([]Info, error) {
	ex, err := dbx.For(db)
	if err != nil {
		return nil, fmt.Errorf("scheduler: list: %w", err)
	}
	var out []Info
	err = ex.Query(ctx, sqlList, nil, func(r dbx.Scanner) error {
		var i Info
		var args string
		var broken *string
		// Stored times are read so that an infinity (written behind
		// Declare) costs its own field, not the whole list.
		var next, last, disabled, brokenAt pgtype.Timestamptz
		if err := r.Scan(&i.Name, &i.Namespace, &i.Spec, &i.TimeZone, &i.Kind, &args, &i.Queue, &i.CatchUp, &i.Overlap,
			&next, &last, &i.LastJobID, &i.Paused, &disabled, &broken, &brokenAt); err != nil {
			return err
		}
		i.Args = json.RawMessage(args)
		i.NextFireAt, i.LastFireAt, i.DisabledAt, i.BrokenAt = next.Time, finite(last), finite(disabled), finite(brokenAt)
		if disabled.Valid && i.DisabledAt == nil {
			i.DisabledAt = &disabled.Time // an infinite disabled_at still disables
		}
		if broken != nil {
			i.BrokenError = *broken
		}
		out = append(out, i)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scheduler: list: %w", err)
	}
	if out == nil {
		out = []Info{}
	}
	return out, nil
}

// Pause stops a schedule firing until Resume. It lasts across restarts and
// redeclarations. db is any core.DB: given a transaction, the pause
// commits with it.
func Pause(ctx context.Context, db core.DB, name string) error {
	ex, err := dbx.For(db)
	if err != nil {
		return fmt.Errorf("scheduler: pause %q: %w", name, err)
	}
	n, err := ex.Exec(ctx, sqlPause, name)
	if err != nil {
		return fmt.Errorf("scheduler: pause %q: %w", name, err)
	}
	if n == 0 {
		return fmt.Errorf("scheduler: pause %q: %w", name, ErrNotFound)
	}
	return nil
}

// Resume lets a paused schedule fire again from its next fire time after
// now; the fires that fell in the pause are not caught up. db is any
// core.DB, as for Pause.
func Resume(ctx context.Context, db core.DB, name string) error {
	return lockOne(ctx, db, name, "resume", func(tx dbx.Execer, _ core.DB, r *row, spec *Spec) error {
		_, err := tx.Exec(ctx, sqlResume, name, spec.Next(r.now))
		return err
	})
}

// TriggerNow enqueues the schedule's job at once, as an extra fire at the
// database's now() (recorded with outcome "triggered"). It does not move the
// schedule's next fire, and works on paused schedules too. db is any
// core.DB: given a transaction (pgx, bun or database/sql), the fire and
// its job commit with it; given a pool or connection, in a transaction of
// their own.
func TriggerNow(ctx context.Context, db core.DB, name string) (core.EnqueueResult, error) {
	var res core.EnqueueResult
	err := lockOne(ctx, db, name, "trigger", func(ex dbx.Execer, tx core.DB, r *row, _ *Spec) error {
		recorded, err := recordFire(ctx, ex, name, r.now, "triggered")
		if err != nil {
			return err
		}
		if !recorded {
			return errors.New("triggered twice in one instant")
		}
		res.ID, err = enqueueFire(ctx, ex, tx, r, r.now)
		return err
	})
	return res, err
}

// Backfilled is what Backfill did.
type Backfilled struct {
	// FireTime is the fire backfilled, as stored (UTC).
	FireTime time.Time
	// JobID is the fire's job: the one Backfill enqueued, or, when the
	// fire had already enqueued one (Existing), that one (0 if retention
	// deleted it).
	JobID int64
	// Existing reports that the fire had already enqueued its job (its
	// own fire, a trigger or an earlier backfill, named by Outcome):
	// Backfill enqueued nothing.
	Existing bool
	Outcome  string
}

// ErrNotAFireTime: Backfill was given a time that is not one of the
// schedule's fire times, or one not yet past.
var ErrNotAFireTime = errors.New("scheduler: not a past fire time of the schedule")

// Backfill fires the schedule for fire time at, a past fire that was
// missed or must be made up (a month-end settlement of a month the
// scheduler was down for), once: the fire is recorded under its key
// (schedule, fire time) as "backfilled", and its job is enqueued with that
// fire time in its metadata (MetaFireTime), so a workflow start with
// StartArgs.FireTimeKey starts the run of that fire, covering that period.
// A fire that already enqueued its job enqueues nothing (Existing, its
// job); one the overlap policy skipped is backfilled. at must be one of
// the schedule's fire times in its time zone (the instant is what counts,
// not the zone it is given in) and before the database's now(), else
// ErrNotAFireTime naming the fire times around it. Paused and disabled
// schedules can be backfilled; the schedule's next fire does not move.
// db is any core.DB, as for TriggerNow.
func Backfill(ctx context.Context, db core.DB, name string, at time.Time) (Backfilled, error) {
	out := Backfilled{FireTime: at.UTC()}
	err := lockOne(ctx, db, name, "backfill", func(ex dbx.Execer, tx core.DB, r *row, spec *Spec) error {
		if !at.Before(r.now) {
			return fmt.Errorf("%w: %s is not before the database's now (%s)", ErrNotAFireTime, at.UTC().Format(time.RFC3339), r.now.UTC().Format(time.RFC3339))
		}
		if fire := spec.Next(at.Add(-time.Nanosecond)); !fire.Equal(at) {
			return fmt.Errorf("%w: %s is not a fire time of %q in %s (the next one after it is %s)", ErrNotAFireTime,
				at.In(spec.Location()).Format(time.RFC3339), spec.String(), spec.Location(), spec.Next(at).Format(time.RFC3339))
		}
		claimed := false
		if err := ex.Query(ctx, sqlRecordBackfill, []any{name, at}, func(dbx.Scanner) error { claimed = true; return nil }); err != nil {
			return fmt.Errorf("record fire %s: %w", at, err)
		}
		if !claimed {
			out.Existing = true
			return ex.Query(ctx, sqlFireOf, []any{name, at}, func(r dbx.Scanner) error { return r.Scan(&out.Outcome, &out.JobID) })
		}
		out.Outcome = "backfilled"
		var err error
		out.JobID, err = enqueueFire(ctx, ex, tx, r, at)
		return err
	})
	return out, err
}

// lockOne runs f in a transaction holding the named schedule's row: db's,
// when it is one, else one begun on db. f gets the transaction as an
// Execer and as the handle (to enqueue in it).
func lockOne(ctx context.Context, db core.DB, name, what string, f func(dbx.Execer, core.DB, *row, *Spec) error) error {
	err := dbx.InTx(ctx, db, func(tx any) error {
		ex, err := dbx.For(tx)
		if err != nil {
			return err
		}
		var r *row
		err = ex.Query(ctx, sqlLockOne, []any{name}, func(s dbx.Scanner) error {
			var err error
			r, err = scanRow(s)
			return err
		})
		if err != nil {
			return err
		}
		if r == nil {
			return ErrNotFound
		}
		var cache specCache
		spec, err := cache.get(r.spec, r.timezone)
		if err != nil {
			return err
		}
		return f(ex, tx, r, spec)
	})
	if err != nil {
		return fmt.Errorf("scheduler: %s %q: %w", what, name, err)
	}
	return nil
}
