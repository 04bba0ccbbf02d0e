package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/scheduler"
)

// Schedule is a stored schedule with its coming and latest fires.
type Schedule struct {
	Name      string          `json:"name"`
	Namespace string          `json:"namespace" doc:"The service whose schedulers declare it"`
	Spec      string          `json:"spec"`
	TimeZone  string          `json:"time_zone"`
	Kind      string          `json:"kind"`
	Args      json.RawMessage `json:"args"`
	Queue     string          `json:"queue"`
	CatchUp   string          `json:"catch_up"`
	Overlap   string          `json:"overlap"`
	Paused    bool            `json:"paused"`
	// DisabledAt is set when the last process to start did not declare the
	// schedule; it does not fire.
	DisabledAt *time.Time `json:"disabled_at,omitempty"`
	// Broken is true when a scheduler could not evaluate the stored spec
	// or time zone (BrokenError says why, since BrokenAt): such processes
	// leave it alone, and it fires only where a process can evaluate it.
	Broken      bool       `json:"broken"`
	BrokenError string     `json:"broken_error,omitempty"`
	BrokenAt    *time.Time `json:"broken_at,omitempty"`
	// NextFires are the coming fire times, the first being the next fire
	// not yet handled (it may be in the past while a scheduler catches up).
	NextFires []time.Time `json:"next_fires" doc:"RFC 3339 in UTC; time_zone says the zone the spec is read in"`
	LastFires []Fire      `json:"last_fires" doc:"Latest fires first"`
}

// Fire is one handled fire time of a schedule.
type Fire struct {
	FireTime   time.Time `json:"fire_time"`
	Outcome    string    `json:"outcome" enum:"enqueued,skipped_overlap,triggered,backfilled"`
	JobID      *int64    `json:"job_id,omitempty"`
	RecordedAt time.Time `json:"recorded_at"`
}

type listSchedulesInput struct {
	Next int `query:"next" minimum:"1" maximum:"20" default:"5" doc:"How many coming fire times to show"`
	Last int `query:"last" minimum:"0" maximum:"50" default:"5" doc:"How many latest fires to show"`
}

type listSchedulesOutput struct {
	Body struct {
		Items []Schedule `json:"items" doc:"Every schedule, by name (schedules are declared in code and few: no paging)"`
	}
}

type scheduleInput struct {
	Name string `path:"name" minLength:"1" maxLength:"200"`
	Next int    `query:"next" minimum:"1" maximum:"20" default:"5"`
	Last int    `query:"last" minimum:"0" maximum:"50" default:"5"`
}

type scheduleNameInput struct {
	Name string `path:"name" minLength:"1" maxLength:"200"`
}

type scheduleOutput struct {
	Body Schedule
}

// ScheduleChange says what a schedule action did.
type ScheduleChange struct {
	Name   string `json:"name"`
	Action string `json:"action" enum:"pause,resume,trigger,backfill"`
	// JobID is the job a trigger or a backfill enqueued (or, for a
	// backfill of a fire that had enqueued one, that job).
	JobID int64 `json:"job_id,omitempty"`
	// FireTime is the fire a backfill fired.
	FireTime *time.Time `json:"fire_time,omitempty"`
	// Existing: the backfilled fire had already enqueued its job; nothing
	// was enqueued.
	Existing bool `json:"existing,omitempty" doc:"The fire had already enqueued its job (named by job_id and outcome): nothing was enqueued"`
	// Outcome is the backfilled fire's recorded outcome.
	Outcome string `json:"outcome,omitempty" enum:"enqueued,triggered,backfilled"`
}

type backfillInput struct {
	Name string `path:"name" minLength:"1" maxLength:"200"`
	Body struct {
		FireTime time.Time `json:"fire_time" doc:"A past fire time of the schedule, RFC 3339 (any offset: the instant counts)"`
	}
}

type scheduleChangeOutput struct {
	Body ScheduleChange
}

func (s *server) registerSchedules(api huma.API) {
	huma.Register(api, op("list-schedules", http.MethodGet, "/v1/schedules", "List schedules with next and last fires", "schedules"),
		func(ctx context.Context, in *listSchedulesInput) (*listSchedulesOutput, error) {
			items, err := s.schedules(ctx, "", in.Next, in.Last)
			if err != nil {
				return nil, s.internalError("list schedules", err)
			}
			out := &listSchedulesOutput{}
			out.Body.Items = items
			return out, nil
		})
	huma.Register(api, op("get-schedule", http.MethodGet, "/v1/schedules/{name}", "Get one schedule", "schedules"),
		func(ctx context.Context, in *scheduleInput) (*scheduleOutput, error) {
			items, err := s.schedules(ctx, in.Name, in.Next, in.Last)
			if err != nil {
				return nil, s.internalError("get schedule", err)
			}
			if len(items) == 0 {
				return nil, huma.Error404NotFound(fmt.Sprintf("schedule %q not found", in.Name))
			}
			return &scheduleOutput{Body: items[0]}, nil
		})
	for _, a := range []struct {
		action, summary string
		do              func(ctx context.Context, tx pgx.Tx, name string) (int64, error)
	}{
		{"pause", "Pause a schedule (lasts across restarts)", func(ctx context.Context, tx pgx.Tx, name string) (int64, error) {
			return 0, scheduler.Pause(ctx, tx, name)
		}},
		{"resume", "Resume a paused schedule", func(ctx context.Context, tx pgx.Tx, name string) (int64, error) {
			return 0, scheduler.Resume(ctx, tx, name)
		}},
		{"trigger", "Enqueue the schedule's job now, as an extra fire", func(ctx context.Context, tx pgx.Tx, name string) (int64, error) {
			r, err := scheduler.TriggerNow(ctx, tx, name)
			return r.ID, err
		}},
	} {
		o := op(a.action+"-schedule", http.MethodPost, "/v1/schedules/{name}/"+a.action, a.summary, "schedules")
		o.Description = "The change and its audit row commit in one transaction."
		huma.Register(api, o, func(ctx context.Context, in *scheduleNameInput) (*scheduleChangeOutput, error) {
			target := map[string]any{"name": in.Name}
			var jobID int64
			_, err := s.change(ctx, "schedules."+a.action, target, func(tx pgx.Tx) (int64, error) {
				var err error
				if jobID, err = a.do(ctx, tx, in.Name); err != nil {
					return 0, err
				}
				if jobID != 0 {
					target["job_id"] = jobID
				}
				return 1, nil
			})
			if errors.Is(err, scheduler.ErrNotFound) {
				return nil, huma.Error404NotFound(fmt.Sprintf("schedule %q not found", in.Name))
			}
			if err != nil {
				return nil, s.internalError(a.action+" schedule", err)
			}
			return &scheduleChangeOutput{Body: ScheduleChange{Name: in.Name, Action: a.action, JobID: jobID}}, nil
		})
	}
	s.registerBackfill(api)
}

// registerBackfill is POST /v1/schedules/{name}/backfill: scheduler.Backfill,
// then its audit row (as the other schedule actions).
func (s *server) registerBackfill(api huma.API) {
	o := op("backfill-schedule", http.MethodPost, "/v1/schedules/{name}/backfill",
		"Fire the schedule for a past fire time, once (the fire's key holds)", "schedules")
	o.Description = "scheduler.Backfill: the fire is recorded under its key (schedule, fire time) and its job enqueued with " +
		"that fire time in its metadata, so a workflow start keyed by the fire time covers that period. A fire that already " +
		"enqueued its job enqueues nothing (existing, with its job). A time that is not a past fire time of the schedule is a 422."
	huma.Register(api, o, func(ctx context.Context, in *backfillInput) (*scheduleChangeOutput, error) {
		b, err := scheduler.Backfill(ctx, s.pool, in.Name, in.Body.FireTime)
		switch {
		case errors.Is(err, scheduler.ErrNotFound):
			return nil, huma.Error404NotFound(fmt.Sprintf("schedule %q not found", in.Name))
		case errors.Is(err, scheduler.ErrNotAFireTime):
			return nil, huma.Error422UnprocessableEntity(err.Error(), &huma.ErrorDetail{Location: "body.fire_time", Value: in.Body.FireTime})
		case err != nil:
			return nil, s.internalError("backfill schedule", err)
		}
		target := map[string]any{"name": in.Name, "fire_time": b.FireTime, "existing": b.Existing}
		if b.JobID != 0 {
			target["job_id"] = b.JobID
		}
		if _, err := s.change(ctx, "schedules.backfill", target, func(pgx.Tx) (int64, error) { return 1, nil }); err != nil {
			return nil, s.internalError("backfill schedule (done; its audit row failed)", err)
		}
		ft := b.FireTime
		return &scheduleChangeOutput{Body: ScheduleChange{Name: in.Name, Action: "backfill", JobID: b.JobID,
			FireTime: &ft, Existing: b.Existing, Outcome: b.Outcome}}, nil
	})
}

// schedules reads every schedule (on the read pool) or the one named (on
// the primary: its page shows it again after a change) with its fires.
func (s *server) schedules(ctx context.Context, name string, next, last int) ([]Schedule, error) {
	db := s.read
	if name != "" {
		db = s.pool
	}
	infos, err := scheduler.List(ctx, db)
	if err != nil {
		return nil, err
	}
	out := []Schedule{}
	for _, in := range infos {
		if name != "" && in.Name != name {
			continue
		}
		sc := Schedule{Name: in.Name, Spec: in.Spec, TimeZone: in.TimeZone, Kind: in.Kind, Args: in.Args, Queue: in.Queue,
			CatchUp: in.CatchUp, Overlap: in.Overlap, Paused: in.Paused, DisabledAt: in.DisabledAt, Namespace: in.Namespace,
			Broken: in.BrokenError != "" || in.BrokenAt != nil, BrokenError: in.BrokenError, BrokenAt: in.BrokenAt,
			NextFires: []time.Time{}, LastFires: []Fire{}}
		if loc, err := time.LoadLocation(in.TimeZone); err == nil {
			if spec, err := scheduler.ParseSpec(in.Spec, loc); err == nil {
				t := in.NextFireAt
				for range next {
					// In UTC, as every other instant of the API: the first
					// (from the database) and the rest (from the spec, in
					// the schedule's zone) were written once with Z and
					// once with the zone's offset.
					sc.NextFires = append(sc.NextFires, t.UTC())
					t = spec.Next(t)
				}
			}
		}
		if last > 0 {
			rows, err := db.Query(ctx, sqlScheduleFires, in.Name, last)
			if err != nil {
				return nil, err
			}
			sc.LastFires, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Fire, error) {
				var f Fire
				return f, r.Scan(&f.FireTime, &f.Outcome, &f.JobID, &f.RecordedAt)
			})
			if err != nil {
				return nil, err
			}
		}
		out = append(out, sc)
	}
	return out, nil
}
