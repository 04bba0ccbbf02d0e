package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/core"
)

// Job is a job as the list shows it.
type Job struct {
	ID          int64      `json:"id"`
	Kind        string     `json:"kind"`
	Queue       string     `json:"queue"`
	State       string     `json:"state" enum:"queued,claimed,succeeded,dead,cancelled"`
	Priority    int        `json:"priority"`
	Attempt     int        `json:"attempt" doc:"Attempts started"`
	MaxAttempts int        `json:"max_attempts"`
	RunAt       time.Time  `json:"run_at"`
	CreatedAt   time.Time  `json:"created_at"`
	AttemptedAt *time.Time `json:"attempted_at,omitempty"`
	AttemptedBy string     `json:"attempted_by,omitempty"`
	FinalizedAt *time.Time `json:"finalized_at,omitempty"`
	LastError   string     `json:"last_error,omitempty" doc:"The latest failure's error (first 1000 bytes in lists)"`
	OrderingKey string     `json:"ordering_key,omitempty"`
	Tags        []string   `json:"tags,omitempty" doc:"The job's tags (core.EnqueueOpts.Tags)"`
}

// JobDetail is one job with its args, metadata, attempts and trace.
type JobDetail struct {
	Job
	Args     json.RawMessage `json:"args"`
	Metadata json.RawMessage `json:"metadata"`
	// TraceID is the W3C trace id of the job's trace ("" when not traced).
	TraceID string `json:"trace_id,omitempty"`
	// TraceURL links to the trace in a tracing UI (Config.TraceURL).
	TraceURL string    `json:"trace_url,omitempty"`
	Attempts []Attempt `json:"attempts"`
}

// Attempt is one execution of a job.
type Attempt struct {
	Attempt    int        `json:"attempt"`
	Worker     string     `json:"worker"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	Outcome    string     `json:"outcome" enum:"failed,succeeded,running,cancelled"`
	Error      string     `json:"error,omitempty"`
}

type listJobsInput struct {
	State           string    `query:"state" enum:"queued,claimed,succeeded,dead,cancelled" doc:"One state; a finished state lists newest finish first"`
	Queue           string    `query:"queue" maxLength:"128"`
	Kind            string    `query:"kind" maxLength:"255"`
	OrderingKey     string    `query:"ordering_key" maxLength:"500"`
	Tags            []string  `query:"tag,explode" maxItems:"32" doc:"Jobs carrying every tag given (repeat the parameter: tag=a&tag=b)"`
	CreatedAfter    time.Time `query:"created_after" doc:"RFC 3339; inclusive"`
	CreatedBefore   time.Time `query:"created_before" doc:"RFC 3339; exclusive"`
	FinalizedAfter  time.Time `query:"finalized_after" doc:"RFC 3339; inclusive"`
	FinalizedBefore time.Time `query:"finalized_before" doc:"RFC 3339; exclusive"`
	Limit           int       `query:"limit" minimum:"1" maximum:"500" default:"50"`
	Cursor          string    `query:"cursor" maxLength:"200" doc:"next_cursor of the previous page"`
}

// Resolve checks what the struct tags cannot: time ranges run forwards,
// job tags are 1 to 255 bytes.
func (in *listJobsInput) Resolve(huma.Context) []error {
	errs := checkRanges("query", in.CreatedAfter, in.CreatedBefore, in.FinalizedAfter, in.FinalizedBefore)
	for i, tag := range in.Tags {
		if tag == "" || len(tag) > 255 {
			errs = append(errs, &huma.ErrorDetail{Location: fmt.Sprintf("query.tag[%d]", i), Message: "a tag is 1 to 255 bytes", Value: tag})
		}
	}
	return errs
}

func checkRanges(loc string, ca, cb, fa, fb time.Time) []error {
	var errs []error
	if !ca.IsZero() && !cb.IsZero() && !ca.Before(cb) {
		errs = append(errs, &huma.ErrorDetail{Location: loc + ".created_before", Message: "must be after created_after", Value: cb})
	}
	if !fa.IsZero() && !fb.IsZero() && !fa.Before(fb) {
		errs = append(errs, &huma.ErrorDetail{Location: loc + ".finalized_before", Message: "must be after finalized_after", Value: fb})
	}
	return errs
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

type listJobsOutput struct {
	Body struct {
		Items      []Job  `json:"items"`
		NextCursor string `json:"next_cursor,omitempty" doc:"Pass as cursor for the next page; absent on the last page. With a queue, kind, ordering key or time filter a page examines at most 10,000 jobs, so it may hold fewer items than limit (even none) and still have a next_cursor: the next page searches on"`
	}
}

type jobIDInput struct {
	ID int64 `path:"id" minimum:"1"`
}

type jobOutput struct {
	Body JobDetail
}

// ChangeResult says what a change did.
type ChangeResult struct {
	ID      int64  `json:"id"`
	State   string `json:"state,omitempty" doc:"The state the change left the job in (absent after a delete); workers may move it on at once"`
	Changed int64  `json:"changed" doc:"Rows changed"`
}

type changeOutput struct {
	Body ChangeResult
}

// BulkFilter selects the jobs of a bulk operation.
type BulkFilter struct {
	State           string    `json:"state,omitempty" enum:"queued,claimed,succeeded,dead,cancelled" doc:"Default: every state the action applies to"`
	Queue           string    `json:"queue,omitempty" maxLength:"128"`
	Kind            string    `json:"kind,omitempty" maxLength:"255"`
	OrderingKey     string    `json:"ordering_key,omitempty" maxLength:"500"`
	Tags            []string  `json:"tags,omitempty" maxItems:"32" doc:"Jobs carrying every one of these tags"`
	CreatedAfter    time.Time `json:"created_after,omitzero"`
	CreatedBefore   time.Time `json:"created_before,omitzero"`
	FinalizedAfter  time.Time `json:"finalized_after,omitzero"`
	FinalizedBefore time.Time `json:"finalized_before,omitzero"`
}

type bulkInput struct {
	Body struct {
		Action string     `json:"action" enum:"requeue,cancel,delete" doc:"requeue: dead/cancelled → queued; cancel: queued/claimed → cancelled; delete: finished jobs"`
		Filter BulkFilter `json:"filter"`
		DryRun bool       `json:"dry_run,omitempty" doc:"Count the matching jobs and change nothing"`
		Max    int        `json:"max,omitempty" minimum:"1" maximum:"100000" doc:"Stop after this many jobs. Default 10000"`
	}
}

// Resolve checks the time ranges and that the state fits the action.
func (in *bulkInput) Resolve(huma.Context) []error {
	f := in.Body.Filter
	errs := checkRanges("body.filter", f.CreatedAfter, f.CreatedBefore, f.FinalizedAfter, f.FinalizedBefore)
	for name, v := range map[string]string{"queue": f.Queue, "kind": f.Kind, "ordering_key": f.OrderingKey} {
		if !cleanText(v) {
			errs = append(errs, &huma.ErrorDetail{Location: "body.filter." + name, Message: "must be UTF-8 without NUL bytes"})
		}
	}
	for i, tag := range f.Tags {
		if tag == "" || len(tag) > 255 || !cleanText(tag) {
			errs = append(errs, &huma.ErrorDetail{Location: fmt.Sprintf("body.filter.tags[%d]", i), Message: "a tag is 1 to 255 bytes of UTF-8 without NUL bytes", Value: tag})
		}
	}
	if f.State != "" && !slices.Contains(bulkStates(in.Body.Action), f.State) {
		errs = append(errs, &huma.ErrorDetail{Location: "body.filter.state",
			Message: fmt.Sprintf("%s applies to jobs in states %s", in.Body.Action, strings.Join(bulkStates(in.Body.Action), ", ")), Value: f.State})
	}
	return errs
}

// bulkStates are the states a bulk action applies to.
func bulkStates(action string) []string {
	switch action {
	case "requeue":
		return []string{"dead", "cancelled"}
	case "cancel":
		return []string{"queued", "claimed"}
	case "delete":
		return []string{"succeeded", "dead", "cancelled"}
	}
	return nil
}

// BulkResult says what a bulk operation did (or, dry, would do).
type BulkResult struct {
	Action  string `json:"action"`
	DryRun  bool   `json:"dry_run"`
	Matched int64  `json:"matched" doc:"Jobs the filter matched (up to max)"`
	Changed int64  `json:"changed" doc:"Jobs changed (0 on a dry run)"`
	Skipped int64  `json:"skipped" doc:"Matched jobs that had moved on (another state) by the time their batch ran, or that another transaction held past the lock timeout; run again to retry them"`
	Batches int    `json:"batches" doc:"Transactions used, each of at most the batch size and audited"`
	Done    bool   `json:"done" doc:"False when the time budget ran out first: run the same request again to continue"`
}

type bulkOutput struct {
	Body BulkResult
}

func (s *server) registerJobs(api huma.API) {
	huma.Register(api, op("list-jobs", http.MethodGet, "/v1/jobs", "List jobs, newest first", "jobs"), s.listJobs)
	huma.Register(api, op("get-job", http.MethodGet, "/v1/jobs/{id}", "Get a job with its attempts and trace id", "jobs"), s.getJob)

	cancel := op("cancel-job", http.MethodPost, "/v1/jobs/{id}/cancel", "Cancel a queued or running job", "jobs")
	cancel.Description = "A running job's lease ends at once, so its worker can record nothing more (core.Cancel)."
	huma.Register(api, cancel, func(ctx context.Context, in *jobIDInput) (*changeOutput, error) {
		return s.jobChange(ctx, "jobs.cancel", in.ID, core.StateCancelled, func(tx pgx.Tx) error { return core.Cancel(ctx, tx, in.ID) })
	})
	huma.Register(api, op("requeue-job", http.MethodPost, "/v1/jobs/{id}/requeue", "Requeue a dead or cancelled job, runnable now", "jobs"),
		func(ctx context.Context, in *jobIDInput) (*changeOutput, error) {
			return s.jobChange(ctx, "jobs.requeue", in.ID, core.StateQueued, func(tx pgx.Tx) error { return core.Requeue(ctx, tx, in.ID) })
		})
	huma.Register(api, op("retry-job-now", http.MethodPost, "/v1/jobs/{id}/retry-now", "Make a job queued for later runnable now", "jobs"),
		func(ctx context.Context, in *jobIDInput) (*changeOutput, error) {
			return s.jobChange(ctx, "jobs.retry_now", in.ID, core.StateQueued, func(tx pgx.Tx) error {
				var queue string
				err := tx.QueryRow(ctx, sqlRetryNow, in.ID).Scan(&queue)
				if errors.Is(err, pgx.ErrNoRows) {
					return notChanged(ctx, tx, in.ID, "it is not queued to run later")
				}
				if err != nil {
					return err
				}
				_, err = tx.Exec(ctx, sqlNotifyQueue, queue)
				return err
			})
		})
	huma.Register(api, op("delete-job", http.MethodDelete, "/v1/jobs/{id}", "Delete a finished job", "jobs"),
		func(ctx context.Context, in *jobIDInput) (*changeOutput, error) {
			return s.jobChange(ctx, "jobs.delete", in.ID, "", func(tx pgx.Tx) error {
				tag, err := tx.Exec(ctx, sqlDeleteFinished, []int64{in.ID})
				if err == nil && tag.RowsAffected() == 0 {
					return notChanged(ctx, tx, in.ID, "only a succeeded, dead or cancelled job can be deleted")
				}
				return err
			})
		})

	bulk := op("bulk-jobs", http.MethodPost, "/v1/jobs/bulk", "Requeue, cancel or delete every job a filter matches", "jobs")
	bulk.Description = "Run with dry_run first to see the count. The change runs in batches, one transaction (and one audit row) each; " +
		"each job goes through core's Cancel/Requeue, so a job that moved on meanwhile is skipped and a running job's worker is fenced off."
	huma.Register(api, bulk, s.bulkJobs)
}

// notChanged explains why a one-job change matched nothing: no such job
// (404) or a state the change does not apply to (409).
func notChanged(ctx context.Context, tx pgx.Tx, id int64, why string) error {
	var state string
	if err := tx.QueryRow(ctx, sqlJobStateOf, id).Scan(&state); errors.Is(err, pgx.ErrNoRows) {
		return core.ErrNotFound
	} else if err != nil {
		return err
	}
	return fmt.Errorf("%w: job is %s; %s", core.ErrIllegalTransition, state, why)
}

// jobChange runs a one-job change with its audit row and maps core's errors
// to problems. The answer's state is the one the change left the job in
// (after; "" for a delete): reading it back after the commit raced the
// workers the change woke, and answered "claimed" for a requeue.
func (s *server) jobChange(ctx context.Context, action string, id int64, after core.JobState, fn func(pgx.Tx) error) (*changeOutput, error) {
	_, err := s.change(ctx, action, map[string]any{"ids": []int64{id}}, func(tx pgx.Tx) (int64, error) { return 1, fn(tx) })
	if err != nil {
		return nil, s.jobError(action, id, err)
	}
	return &changeOutput{Body: ChangeResult{ID: id, State: string(after), Changed: 1}}, nil
}

func (s *server) jobError(what string, id int64, err error) error {
	switch {
	case errors.Is(err, core.ErrNotFound):
		return huma.Error404NotFound(fmt.Sprintf("job %d not found", id))
	case errors.Is(err, core.ErrIllegalTransition):
		msg := err.Error()
		if i := strings.LastIndex(msg, "core: "); i >= 0 {
			msg = msg[i+len("core: "):]
		}
		return huma.Error409Conflict(fmt.Sprintf("%s refused for job %d: %s", what, id, msg))
	case errors.Is(err, core.ErrUniqueConflict):
		return huma.Error409Conflict(fmt.Sprintf("%s: job %d: another job with its unique key is queued or running", what, id))
	}
	return s.internalError(what, err)
}

func (s *server) listJobs(ctx context.Context, in *listJobsInput) (*listJobsOutput, error) {
	f := jobFilter{Queue: in.Queue, Kind: in.Kind, OrderingKey: in.OrderingKey, Tags: in.Tags,
		CreatedAfter: timePtr(in.CreatedAfter), CreatedBefore: timePtr(in.CreatedBefore),
		FinalizedAfter: timePtr(in.FinalizedAfter), FinalizedBefore: timePtr(in.FinalizedBefore)}
	if in.State != "" {
		f.States = []string{in.State}
	}
	// A finished state lists by finish time on relay_jobs_finalized_idx;
	// anything else by id.
	byFinalized := core.JobState(in.State).Final()
	kind := "jobs"
	if byFinalized {
		kind = "jobs-" + in.State
	}
	c, err := decodeCursor(in.Cursor, kind)
	if err != nil {
		return nil, err
	}
	var sql string
	var args []any
	if byFinalized {
		sql, args = sqlListJobsByFinalized(f, c, in.Limit+1)
	} else {
		sql, args = sqlListJobsByID(f, c, in.Limit+1)
	}
	rows, err := s.read.Query(ctx, sql, args...)
	if err != nil {
		return nil, s.internalError("list jobs", err)
	}
	items, err := pgx.CollectRows(rows, scanJob)
	if err != nil {
		return nil, s.internalError("list jobs", err)
	}
	out := &listJobsOutput{}
	out.Body.Items = items
	if len(items) > in.Limit {
		out.Body.Items = items[:in.Limit]
		last := items[in.Limit-1]
		next := cursor{Kind: kind, ID: last.ID}
		if byFinalized && last.FinalizedAt != nil {
			next.At = *last.FinalizedAt
		}
		out.Body.NextCursor = next.encode()
	} else if f.hasOther() {
		// A short page of a filter checked row by row: its scan may have
		// stopped at listScanRows with jobs left to search.
		bound, err := s.scanBound(ctx, f, c, byFinalized, kind)
		if err != nil {
			return nil, s.internalError("list jobs", err)
		}
		out.Body.NextCursor = bound
	}
	for i := range out.Body.Items {
		if e := &out.Body.Items[i].LastError; len(*e) > 1000 {
			*e = (*e)[:1000]
		}
	}
	return out, nil
}

// scanBound is the cursor after the last job a short page examined, or ""
// when the page examined every job left.
func (s *server) scanBound(ctx context.Context, f jobFilter, after *cursor, byFinalized bool, kind string) (string, error) {
	next := cursor{Kind: kind}
	var err error
	if byFinalized {
		sql, args := sqlScanBoundByFinalized(f, after)
		var at *time.Time
		err = s.read.QueryRow(ctx, sql, args...).Scan(&at, &next.ID)
		if at != nil {
			next.At = *at
		}
	} else {
		sql, args := sqlScanBoundByID(f, after)
		err = s.read.QueryRow(ctx, sql, args...).Scan(&next.ID)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return next.encode(), nil
}

func scanJob(r pgx.CollectableRow) (Job, error) {
	var j Job
	err := r.Scan(&j.ID, &j.Kind, &j.Queue, &j.State, &j.Priority, &j.Attempt, &j.MaxAttempts, &j.RunAt, &j.CreatedAt,
		&j.AttemptedAt, &j.AttemptedBy, &j.FinalizedAt, &j.LastError, &j.OrderingKey, &j.Tags)
	return j, err
}

func (s *server) getJob(ctx context.Context, in *jobIDInput) (*jobOutput, error) {
	row, err := core.JobGet(ctx, s.pool, in.ID)
	if err != nil {
		return nil, s.jobError("get job", in.ID, err)
	}
	var traceparent string
	if err := s.pool.QueryRow(ctx, sqlJobTraceparent, in.ID).Scan(&traceparent); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, s.internalError("get job", err)
	}
	d := JobDetail{
		Job:  jobFromRow(row),
		Args: row.EncodedArgs, Metadata: row.Metadata, TraceID: traceID(traceparent),
	}
	if d.TraceID != "" && s.cfg.TraceURL != "" {
		d.TraceURL = strings.ReplaceAll(s.cfg.TraceURL, "{trace_id}", d.TraceID)
	}
	d.Attempts = attempts(row)
	return &jobOutput{Body: d}, nil
}

// jobFromRow is the API's view of a job core read.
func jobFromRow(row *core.JobRow) Job {
	return Job{ID: row.ID, Kind: row.Kind, Queue: row.Queue, State: string(row.State), Priority: row.Priority,
		Attempt: row.Attempt, MaxAttempts: row.MaxAttempts, RunAt: row.RunAt, CreatedAt: row.CreatedAt,
		AttemptedAt: timePtr(row.AttemptedAt), AttemptedBy: row.AttemptedBy, FinalizedAt: row.FinalizedAt,
		LastError: row.LastError, OrderingKey: row.OrderingKey, Tags: row.Tags}
}

// traceID is the trace id of a W3C traceparent (version-traceid-spanid-flags):
// 32 lowercase hex digits, not all zero, else "". The traceparent comes
// from whoever enqueued the job, and the id goes into Config.TraceURL's
// links.
func traceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[1]) != 32 || parts[1] == strings.Repeat("0", 32) {
		return ""
	}
	for _, c := range parts[1] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return ""
		}
	}
	return parts[1]
}

// attempts is a job's attempt history: the failed attempts recorded in its
// history, then its latest attempt when that one did not fail (it succeeded,
// is running, or was cancelled).
func attempts(j *core.JobRow) []Attempt {
	out := make([]Attempt, 0, j.Attempt)
	for _, h := range j.History {
		fin := h.FinishedAt
		out = append(out, Attempt{Attempt: h.Attempt, Worker: h.Worker, StartedAt: h.StartedAt, FinishedAt: &fin, Outcome: "failed", Error: h.Error})
	}
	recorded := len(j.History) > 0 && j.History[len(j.History)-1].Attempt == j.Attempt
	if j.Attempt == 0 || recorded || j.AttemptedAt.IsZero() {
		return out
	}
	last := Attempt{Attempt: j.Attempt, Worker: j.AttemptedBy, StartedAt: j.AttemptedAt}
	switch j.State {
	case core.StateSucceeded:
		last.Outcome, last.FinishedAt = "succeeded", j.FinalizedAt
	case core.StateClaimed:
		last.Outcome = "running"
	case core.StateCancelled:
		last.Outcome, last.FinishedAt = "cancelled", j.FinalizedAt
	default:
		return out
	}
	return append(out, last)
}

func (s *server) bulkJobs(ctx context.Context, in *bulkInput) (*bulkOutput, error) {
	b := in.Body
	max := b.Max
	if max == 0 {
		max = 10000
	}
	f := jobFilter{Queue: b.Filter.Queue, Kind: b.Filter.Kind, OrderingKey: b.Filter.OrderingKey, Tags: b.Filter.Tags,
		CreatedAfter: timePtr(b.Filter.CreatedAfter), CreatedBefore: timePtr(b.Filter.CreatedBefore),
		FinalizedAfter: timePtr(b.Filter.FinalizedAfter), FinalizedBefore: timePtr(b.Filter.FinalizedBefore),
		States: bulkStates(b.Action)}
	if b.Filter.State != "" {
		f.States = []string{b.Filter.State}
	}
	res := BulkResult{Action: b.Action, DryRun: b.DryRun, Done: true}
	if b.DryRun {
		sql, args := sqlBulkCount(f, max)
		if err := s.pool.QueryRow(ctx, sql, args...).Scan(&res.Matched); err != nil {
			return nil, s.internalError("bulk count", err)
		}
		return &bulkOutput{Body: res}, nil
	}
	below := int64(1<<63 - 1)
	budget := time.Now().Add(s.cfg.BulkTimeBudget)
	for res.Matched < int64(max) {
		if time.Now().After(budget) {
			res.Done = false
			break
		}
		batch := min(s.cfg.BulkBatchSize, max-int(res.Matched))
		sql, args := sqlBulkBatch(f, below, batch)
		rows, err := s.pool.Query(ctx, sql, args...)
		if err != nil {
			return nil, s.internalError("bulk "+b.Action, err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return nil, s.internalError("bulk "+b.Action, err)
		}
		if len(ids) == 0 {
			break
		}
		below = ids[len(ids)-1]
		res.Matched += int64(len(ids))
		n, err := s.change(ctx, "jobs.bulk_"+b.Action, map[string]any{"filter": b.Filter, "ids": ids},
			func(tx pgx.Tx) (int64, error) { return bulkBatch(ctx, tx, b.Action, f.States, ids) })
		if err != nil {
			return nil, s.internalError("bulk "+b.Action, err)
		}
		res.Batches++
		res.Changed += n
		res.Skipped += int64(len(ids)) - n
		if len(ids) < batch {
			break
		}
	}
	return &bulkOutput{Body: res}, nil
}

// bulkBatch applies a bulk action to one batch of ids in tx and returns how
// many changed. Cancel and requeue go through core, one job at a time, each
// in a savepoint: a job that has moved to another state since it was picked
// (a worker finished it), or that another transaction holds past the lock
// timeout, or that has left the filter's states for another state the
// action applies to, is skipped, not an error. Delete skips held rows without waiting,
// and rows no longer in the filter's states (a dead job picked, requeued
// and succeeded since).
func bulkBatch(ctx context.Context, tx pgx.Tx, action string, states []string, ids []int64) (int64, error) {
	if action == "delete" {
		tag, err := tx.Exec(ctx, sqlBulkDeleteFinished, ids, states)
		return tag.RowsAffected(), err
	}
	var n int64
	for _, id := range ids {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return n, err
		}
		// core moves a job from any state the action applies to; when the
		// filter names fewer, hold the row and check it is still in one.
		if len(states) < len(bulkStates(action)) {
			var state string
			if err = sp.QueryRow(ctx, sqlLockJobState, id).Scan(&state); err == nil && !slices.Contains(states, state) {
				err = core.ErrIllegalTransition
			}
		}
		switch {
		case err != nil:
		case action == "cancel":
			err = core.Cancel(ctx, sp, id)
		default:
			err = core.Requeue(ctx, sp, id)
		}
		switch {
		case err == nil:
			n++
			if err := sp.Commit(ctx); err != nil {
				return n, err
			}
		case errors.Is(err, core.ErrIllegalTransition), errors.Is(err, core.ErrNotFound), errors.Is(err, core.ErrUniqueConflict),
			errors.Is(err, pgx.ErrNoRows), isLockTimeout(err):
			if err := sp.Rollback(ctx); err != nil {
				return n, err
			}
		default:
			return n, err
		}
	}
	return n, nil
}
