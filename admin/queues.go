package admin

import (
	"context"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/liveness"
)

// Queue is a queue's state: its backlog, what runs, recent finishes, pause.
type Queue struct {
	Name string `json:"name"`
	// Runnable jobs wait for a worker now; Scheduled ones wait for run_at.
	Runnable  int64 `json:"runnable"`
	Scheduled int64 `json:"scheduled"`
	Running   int64 `json:"running"`
	// OldestRunnableAgeSeconds is how long the oldest runnable job has
	// waited since its run_at (0 when none waits).
	OldestRunnableAgeSeconds float64 `json:"oldest_runnable_age_seconds"`
	// Succeeded and Failed (ended dead) count finishes of the window.
	Succeeded          int64   `json:"succeeded"`
	Failed             int64   `json:"failed"`
	SucceededPerSecond float64 `json:"succeeded_per_second"`
	FailedPerSecond    float64 `json:"failed_per_second"`
	WindowMinutes      int     `json:"window_minutes"`
	// Dead counts the queue's dead jobs still kept (any age).
	Dead    int64         `json:"dead"`
	Minutes []MinuteCount `json:"minutes" doc:"Finishes per minute of the window, oldest first; minutes without finishes are absent"`
	// Processes counts the live worker processes serving the queue, and
	// Slots their jobs at once. A queue with runnable jobs, not paused,
	// and no process is served by nobody: its jobs wait for ever.
	Processes int        `json:"processes" doc:"Live worker processes serving the queue"`
	Slots     int        `json:"slots" doc:"Jobs the live worker processes of the queue run at once, together"`
	Paused    bool       `json:"paused"`
	PausedAt  *time.Time `json:"paused_at,omitempty"`
	PausedBy  string     `json:"paused_by,omitempty"`
}

// MinuteCount is one minute's finishes.
type MinuteCount struct {
	Minute    time.Time `json:"minute"`
	Succeeded int64     `json:"succeeded"`
	Failed    int64     `json:"failed"`
}

type listQueuesInput struct {
	WindowMinutes int `query:"window_minutes" minimum:"1" maximum:"60" default:"15" doc:"Minutes of finishes to count"`
}

type listQueuesOutput struct {
	Body struct {
		Items []Queue `json:"items" doc:"Every queue with jobs queued, running or dead, finishes in the window, or a pause (queues are few: no paging)"`
	}
}

type queueInput struct {
	Name          string `path:"name" minLength:"1" maxLength:"128"`
	WindowMinutes int    `query:"window_minutes" minimum:"1" maximum:"60" default:"15"`
}

type queueNameInput struct {
	Name string `path:"name" minLength:"1" maxLength:"128"`
}

type queueOutput struct {
	Body Queue
}

// PauseResult says what a pause or resume did.
type PauseResult struct {
	Queue   string `json:"queue"`
	Paused  bool   `json:"paused" doc:"Whether the queue is paused now"`
	Changed bool   `json:"changed" doc:"False when it already was"`
}

type pauseOutput struct {
	Body PauseResult
}

func (s *server) registerQueues(api huma.API) {
	huma.Register(api, op("list-queues", http.MethodGet, "/v1/queues", "List queues with depth, running, oldest age and recent rates", "queues"),
		func(ctx context.Context, in *listQueuesInput) (*listQueuesOutput, error) {
			qs, err := s.queues(ctx, in.WindowMinutes, "")
			if err != nil {
				return nil, s.internalError("list queues", err)
			}
			out := &listQueuesOutput{}
			out.Body.Items = qs
			return out, nil
		})
	huma.Register(api, op("get-queue", http.MethodGet, "/v1/queues/{name}", "Get one queue", "queues"),
		func(ctx context.Context, in *queueInput) (*queueOutput, error) {
			qs, err := s.queues(ctx, in.WindowMinutes, in.Name)
			if err != nil {
				return nil, s.internalError("get queue", err)
			}
			return &queueOutput{Body: qs[0]}, nil
		})
	pause := op("pause-queue", http.MethodPost, "/v1/queues/{name}/pause", "Pause a queue: no worker claims its jobs", "queues")
	pause.Description = "Stored in the database: every worker process stops claiming the queue's jobs at its next claim " +
		"(within one poll interval). Running jobs finish. A queue may be paused before it has jobs."
	huma.Register(api, pause, func(ctx context.Context, in *queueNameInput) (*pauseOutput, error) {
		var changed bool
		_, err := s.change(ctx, "queues.pause", map[string]any{"queue": in.Name}, func(tx pgx.Tx) (int64, error) {
			var err error
			changed, err = core.PauseQueue(ctx, tx, in.Name, subject(ctx))
			return b2i(changed), err
		})
		if err != nil {
			return nil, s.internalError("pause queue", err)
		}
		return &pauseOutput{Body: PauseResult{Queue: in.Name, Paused: true, Changed: changed}}, nil
	})
	huma.Register(api, op("resume-queue", http.MethodPost, "/v1/queues/{name}/resume", "Resume a paused queue", "queues"),
		func(ctx context.Context, in *queueNameInput) (*pauseOutput, error) {
			var changed bool
			_, err := s.change(ctx, "queues.resume", map[string]any{"queue": in.Name}, func(tx pgx.Tx) (int64, error) {
				var err error
				changed, err = core.ResumeQueue(ctx, tx, in.Name)
				return b2i(changed), err
			})
			if err != nil {
				return nil, s.internalError("resume queue", err)
			}
			return &pauseOutput{Body: PauseResult{Queue: in.Name, Paused: false, Changed: changed}}, nil
		})
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// queues reads the stats of every queue (on the read pool), or of one (on
// the primary: its page shows it again after a pause or a resume; zeros for
// an idle or unknown one), with the live processes serving each.
func (s *server) queues(ctx context.Context, window int, name string) ([]Queue, error) {
	db := s.read
	if name != "" {
		db = s.pool
	}
	rows, err := db.Query(ctx, sqlQueueStats, window, name)
	if err != nil {
		return nil, err
	}
	secs := float64(window * 60)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Queue, error) {
		q := Queue{WindowMinutes: window, Minutes: []MinuteCount{}}
		err := r.Scan(&q.Name, &q.Runnable, &q.Scheduled, &q.Running, &q.OldestRunnableAgeSeconds,
			&q.Succeeded, &q.Failed, &q.Dead, &q.PausedAt, &q.PausedBy)
		q.Paused = q.PausedAt != nil
		q.SucceededPerSecond, q.FailedPerSecond = float64(q.Succeeded)/secs, float64(q.Failed)/secs
		return q, err
	})
	if err != nil {
		return nil, err
	}
	if name != "" && len(out) == 0 { // no jobs, no pause: an idle (or unknown) queue, maybe served
		out = []Queue{{Name: name, WindowMinutes: window, Minutes: []MinuteCount{}}}
	}
	byName := map[string]*Queue{}
	for i := range out {
		byName[out[i].Name] = &out[i]
	}
	procs, err := liveness.List(ctx, db)
	if err != nil {
		return nil, err
	}
	for _, p := range procs {
		for name, slots := range p.Queues {
			if q := byName[name]; q != nil {
				q.Processes++
				q.Slots += slots
			}
		}
	}
	rows, err = db.Query(ctx, sqlQueueMinutes, window, name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var q string
		var m MinuteCount
		if err := rows.Scan(&q, &m.Minute, &m.Succeeded, &m.Failed); err != nil {
			return nil, err
		}
		if p := byName[q]; p != nil {
			p.Minutes = append(p.Minutes, m)
		}
	}
	return out, rows.Err()
}
