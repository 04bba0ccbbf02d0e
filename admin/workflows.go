package admin

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/workflow"
)

// WorkflowRun is a workflow run as the list shows it.
type WorkflowRun struct {
	ID              string     `json:"id"`
	Workflow        string     `json:"workflow"`
	State           string     `json:"state" enum:"pending,running,compensating,completed,failed,compensated,cancelled,terminated"`
	Queue           string     `json:"queue"`
	ParentID        string     `json:"parent_id,omitempty" doc:"The run that started this one as a child"`
	Error           string     `json:"error,omitempty" doc:"Why the run failed (first 1000 bytes in lists)"`
	CancelRequested bool       `json:"cancel_requested"`
	Executions      int        `json:"executions" doc:"Executions that wrote something (replays included)"`
	CreatedAt       time.Time  `json:"created_at"`
	StartedAt       *time.Time `json:"started_at,omitempty"`
	FinishedAt      *time.Time `json:"finished_at,omitempty"`
	DurationMS      *int64     `json:"duration_ms,omitempty" doc:"created_at to finished_at, once finished"`
	Tags            []string   `json:"tags" doc:"The run's tags (set at start or added by the workflow)"`
	ParentClose     string     `json:"parent_close,omitempty" enum:"cancel,abandon,terminate" doc:"A child's parent-close policy (workflow.ChildOpts.ParentClose): what its parent's end does to it"`
}

// WorkflowRunDetail is one run with its input, output, step timeline and
// child runs.
type WorkflowRunDetail struct {
	WorkflowRun
	Input      json.RawMessage `json:"input"`
	Output     json.RawMessage `json:"output,omitempty" doc:"Set once completed"`
	JobID      int64           `json:"job_id,omitempty" doc:"The core job executing the run"`
	Generation int             `json:"generation" doc:"ContinueAsNew count"`
	TraceID    string          `json:"trace_id,omitempty"`
	TraceURL   string          `json:"trace_url,omitempty"`
	Steps      []WorkflowStep  `json:"steps" doc:"The timeline, by position in the run's code path"`
	Children   []WorkflowRun   `json:"children" doc:"Child runs, in the order started (at most 1000)"`
	// SetAsideSignals are the signals the run set aside: their payload did
	// not decode into the type its WaitSignal asked for.
	SetAsideSignals []WorkflowSignal `json:"set_aside_signals" doc:"Signals set aside because their payload did not decode into the type the run's WaitSignal asked for, oldest first (at most 100); the run waited on"`
	// Updates are the run's update requests (workflow.Update), newest
	// first.
	Updates []WorkflowUpdate `json:"updates" doc:"The run's update requests, newest first (at most 100): pending until the run answers, then completed (with its error, if the handler failed) or rejected"`
}

// WorkflowUpdate is one update request sent to a run.
type WorkflowUpdate struct {
	ID        int64      `json:"id"`
	Name      string     `json:"name"`
	State     string     `json:"state" enum:"pending,completed,rejected"`
	Error     string     `json:"error,omitempty" doc:"Why it was rejected, or the handler's error"`
	SentAt    time.Time  `json:"sent_at"`
	HandledAt *time.Time `json:"handled_at,omitempty"`
}

// WorkflowSignal is a signal a run set aside, with why.
type WorkflowSignal struct {
	ID           int64           `json:"id"`
	Name         string          `json:"name"`
	SentAt       time.Time       `json:"sent_at"`
	SetAsideAt   *time.Time      `json:"set_aside_at,omitempty"`
	DecodeError  string          `json:"decode_error" doc:"Why the payload did not decode"`
	PayloadBytes int             `json:"payload_bytes"`
	Payload      json.RawMessage `json:"payload,omitempty" doc:"Absent when larger than 64 KiB (payload_bytes says how large)"`
}

// WorkflowStep is one checkpoint of a run's timeline.
type WorkflowStep struct {
	Position int    `json:"position"`
	Key      string `json:"key"`
	Kind     string `json:"kind" doc:"step, tx, sleep, signal, child, value, patch, event, tags"`
	State    string `json:"state" doc:"completed, failed (for good), retrying (waits for wake_at), waiting (a sleep, a signal or a child)"`
	// Compensation is true for the undo steps a failed or cancelled run ran
	// (key compensate:<name>).
	Compensation bool   `json:"compensation"`
	Attempts     int    `json:"attempts" doc:"Attempts recorded; the step row keeps the count and the latest error"`
	Error        string `json:"error,omitempty" doc:"The latest attempt's error"`
	// StartedAt is when the step's row was first written: its first failed
	// attempt, its completion, or the start of a wait.
	StartedAt   time.Time       `json:"started_at"`
	FinishedAt  *time.Time      `json:"finished_at,omitempty"`
	DurationMS  *int64          `json:"duration_ms,omitempty" doc:"started_at to finished_at"`
	WakeAt      *time.Time      `json:"wake_at,omitempty" doc:"When a wait or a retry delay ends"`
	ChildID     string          `json:"child_id,omitempty"`
	OutputBytes int             `json:"output_bytes"`
	Output      json.RawMessage `json:"output,omitempty" doc:"Absent when larger than 64 KiB (output_bytes says how large)"`
	// AttemptLog is the step's attempts, oldest first (the latest 20 that
	// ran its function): the timeline's retries.
	AttemptLog []WorkflowStepAttempt `json:"attempt_log" doc:"Each attempt's start, end and error, oldest first (the latest 20)"`
	// AttemptLogError says why the stored attempt log could not be read
	// (then attempt_log is empty).
	AttemptLogError string `json:"attempt_log_error,omitempty" doc:"Why the stored attempt log could not be read (a value of another shape)"`
	// Heartbeat is the step's latest heartbeat (workflow.Heartbeat), kept
	// across its attempts.
	Heartbeat *WorkflowStepHeartbeat `json:"heartbeat,omitempty" doc:"The step's latest heartbeat (workflow.Heartbeat), kept across attempts"`
}

// WorkflowStepHeartbeat is the latest heartbeat a step's function sent.
type WorkflowStepHeartbeat struct {
	Attempt      int             `json:"attempt" doc:"The attempt that sent it"`
	At           time.Time       `json:"at"`
	DetailsBytes int             `json:"details_bytes"`
	Details      json.RawMessage `json:"details,omitempty" doc:"Absent when larger than 64 KiB (details_bytes says how large)"`
}

// WorkflowStepAttempt is one attempt of a step's function.
type WorkflowStepAttempt struct {
	Attempt    int       `json:"attempt"`
	StartedAt  time.Time `json:"started_at" doc:"On the clock of the worker that ran it"`
	FinishedAt time.Time `json:"finished_at"`
	DurationMS int64     `json:"duration_ms"`
	Error      string    `json:"error,omitempty" doc:"Empty for the attempt that succeeded; at most 1 KiB"`
}

// maxStepOutputShown bounds the step outputs a run's page carries.
const maxStepOutputShown = 64 << 10

type listRunsInput struct {
	Workflow      string    `query:"workflow" maxLength:"255"`
	State         string    `query:"state" enum:"pending,running,compensating,completed,failed,compensated,cancelled,terminated"`
	CreatedAfter  time.Time `query:"created_after" doc:"RFC 3339; inclusive"`
	CreatedBefore time.Time `query:"created_before" doc:"RFC 3339; exclusive"`
	Limit         int       `query:"limit" minimum:"1" maximum:"500" default:"50"`
	Cursor        string    `query:"cursor" maxLength:"600" doc:"next_cursor of the previous page"`
	Tags          []string  `query:"tag,explode" maxItems:"32" doc:"Runs carrying every tag given (repeat the parameter: ?tag=tenant:acme&tag=order:123)"`
}

// Resolve checks what the tags cannot.
func (in *listRunsInput) Resolve(hctx huma.Context) []error {
	errs := checkRanges("query", in.CreatedAfter, in.CreatedBefore, time.Time{}, time.Time{})
	u := hctx.URL()
	if tags := u.Query()["tag"]; len(tags) > len(in.Tags) { // an empty ?tag= is left out of in.Tags
		errs = append(errs, &huma.ErrorDetail{Location: "query.tag", Message: "a tag is empty"})
	}
	if !cleanText(in.Workflow) {
		errs = append(errs, &huma.ErrorDetail{Location: "query.workflow", Message: "must be UTF-8 without NUL bytes"})
	}
	for i, t := range in.Tags {
		if t == "" || len(t) > workflow.MaxTagBytes || !cleanText(t) {
			errs = append(errs, &huma.ErrorDetail{Location: fmt.Sprintf("query.tag[%d]", i), Value: t,
				Message: fmt.Sprintf("a tag is 1 to %d bytes of UTF-8 without NUL bytes", workflow.MaxTagBytes)})
		}
	}
	return errs
}

type listRunsOutput struct {
	Body struct {
		Items      []WorkflowRun `json:"items"`
		NextCursor string        `json:"next_cursor,omitempty" doc:"Pass as cursor for the next page; absent on the last page"`
	}
}

type runIDInput struct {
	ID string `path:"id" minLength:"1" maxLength:"255" doc:"The run id (a child's is <parent id>/<key>: escape its slash as %2F)"`
}

// Resolve refuses ids the database cannot hold as text.
func (in *runIDInput) Resolve(huma.Context) []error {
	if !cleanText(in.ID) {
		return []error{&huma.ErrorDetail{Location: "path.id", Message: "must be UTF-8 without NUL bytes"}}
	}
	return nil
}

type runOutput struct {
	Body WorkflowRunDetail
}

type signalInput struct {
	ID   string `path:"id" minLength:"1" maxLength:"255"`
	Body struct {
		Name    string          `json:"name" minLength:"1" maxLength:"200" doc:"The signal's name, as the run's WaitSignal asks for it"`
		Payload json.RawMessage `json:"payload,omitempty" doc:"Any JSON value (default null), decoded by the wait into its type"`
	}
}

// Resolve checks the signal's name.
func (in *signalInput) Resolve(ctx huma.Context) []error {
	errs := (&runIDInput{ID: in.ID}).Resolve(ctx)
	if !cleanText(in.Body.Name) {
		errs = append(errs, &huma.ErrorDetail{Location: "body.name", Message: "must be UTF-8 without NUL bytes"})
	}
	return errs
}

type terminateInput struct {
	ID   string `path:"id" minLength:"1" maxLength:"255"`
	Body struct {
		Reason string `json:"reason" minLength:"1" maxLength:"1024" doc:"Why the run is terminated: stored as the run's error and in the audit row"`
	}
}

// Resolve checks the id and the reason.
func (in *terminateInput) Resolve(ctx huma.Context) []error {
	errs := (&runIDInput{ID: in.ID}).Resolve(ctx)
	if !cleanText(in.Body.Reason) {
		errs = append(errs, &huma.ErrorDetail{Location: "body.reason", Message: "must be UTF-8 without NUL bytes"})
	}
	return errs
}

// RunChange says what a change to a run did.
type RunChange struct {
	ID     string `json:"id"`
	Action string `json:"action" enum:"cancel,retry,signal,terminate"`
	State  string `json:"state" doc:"The run's state right after the change; its executions move it on"`
}

type runChangeOutput struct {
	Body RunChange
}

// WorkflowStats counts the runs of the states an operator watches.
type WorkflowStats struct {
	Failed       int64 `json:"failed"`
	Compensating int64 `json:"compensating"`
	Running      int64 `json:"running"`
	Pending      int64 `json:"pending"`
	Cap          int64 `json:"cap" doc:"Counts stop here"`
}

type workflowStatsOutput struct {
	Body WorkflowStats
}

const statsCap = 10000

// registerWorkflows registers the workflow endpoints (/v1/workflows/…):
// runs listed by workflow, state and time; a run with its step timeline
// and child runs; cancel, terminate, retry from the failed step, send a
// signal. The changes go through the workflow package (Cancel, Terminate,
// Retry, Signal) in the
// transaction that writes their audit row.
func (s *server) registerWorkflows(api huma.API) {
	huma.Register(api, op("list-workflow-runs", http.MethodGet, "/v1/workflows/runs",
		"List workflow runs by workflow, state and creation time, newest first", "workflows"), s.listRuns)
	huma.Register(api, op("workflow-stats", http.MethodGet, "/v1/workflows/stats",
		"Count the failed, compensating, running and pending runs", "workflows"),
		func(ctx context.Context, _ *struct{}) (*workflowStatsOutput, error) {
			out := &workflowStatsOutput{Body: WorkflowStats{Cap: statsCap}}
			for state, n := range map[string]*int64{"failed": &out.Body.Failed, "compensating": &out.Body.Compensating,
				"running": &out.Body.Running, "pending": &out.Body.Pending} {
				sql, args := sqlCountRunsOfState(state)
				if err := s.read.QueryRow(ctx, sql, append(args, statsCap)...).Scan(n); err != nil {
					return nil, s.internalError("workflow stats", err)
				}
			}
			return out, nil
		})
	huma.Register(api, op("get-workflow-run", http.MethodGet, "/v1/workflows/runs/{id}",
		"Get a run with its input, output, step timeline and child runs", "workflows"), s.getRun)

	cancel := op("cancel-workflow-run", http.MethodPost, "/v1/workflows/runs/{id}/cancel",
		"Cancel a run and its unfinished children (their compensations run)", "workflows")
	cancel.Description = "Asks the run to cancel and wakes it: waits and sleeps end, registered compensations run newest first, " +
		"and the run ends cancelled. A finished run is 409."
	huma.Register(api, cancel, func(ctx context.Context, in *runIDInput) (*runChangeOutput, error) {
		return s.runChange(ctx, "cancel", in.ID, nil, func(tx pgx.Tx) error { return workflow.Cancel(ctx, tx, in.ID) })
	})
	retry := op("retry-workflow-run", http.MethodPost, "/v1/workflows/runs/{id}/retry",
		"Run a failed run again from its failed step", "workflows")
	retry.Description = "The checkpoints before the failed step are kept, the failed step and those after it are dropped, " +
		"and a new execution is queued. Only a failed run (not a compensated or cancelled one) can be retried: else 409. " +
		"A run failed by a child: retry the child, then the parent."
	huma.Register(api, retry, func(ctx context.Context, in *runIDInput) (*runChangeOutput, error) {
		return s.runChange(ctx, "retry", in.ID, nil, func(tx pgx.Tx) error { return workflow.Retry(ctx, tx, in.ID) })
	})
	terminate := op("terminate-workflow-run", http.MethodPost, "/v1/workflows/runs/{id}/terminate",
		"Terminate a run now, without running its compensations", "workflows")
	terminate.Description = "Ends the run terminated at once, wherever it is, with the reason as its error: its compensations do not run, " +
		"its job is cancelled, its unfinished children are asked to cancel and its parent is woken. Cancel is the stop that undoes; " +
		"this is the hammer. A finished run is 409."
	huma.Register(api, terminate, func(ctx context.Context, in *terminateInput) (*runChangeOutput, error) {
		target := map[string]any{"reason": in.Body.Reason}
		return s.runChange(ctx, "terminate", in.ID, target, func(tx pgx.Tx) error {
			return workflow.Terminate(ctx, tx, in.ID, in.Body.Reason)
		})
	})
	signal := op("signal-workflow-run", http.MethodPost, "/v1/workflows/runs/{id}/signal",
		"Send a signal (name and JSON payload) to a run", "workflows")
	signal.Description = "The signal waits in the run's mailbox until a WaitSignal of that name consumes it; the run is woken. " +
		"A finished run is 409."
	huma.Register(api, signal, func(ctx context.Context, in *signalInput) (*runChangeOutput, error) {
		payload := in.Body.Payload
		if len(payload) == 0 {
			payload = json.RawMessage("null")
		}
		target := map[string]any{"name": in.Body.Name, "payload_bytes": len(payload)}
		return s.runChange(ctx, "signal", in.ID, target, func(tx pgx.Tx) error {
			return workflow.Signal(ctx, tx, in.ID, in.Body.Name, payload)
		})
	})
}

// runChange makes a change to run id through the workflow package in the
// audit row's transaction, and maps its errors to problems.
func (s *server) runChange(ctx context.Context, action, id string, target map[string]any, fn func(pgx.Tx) error) (*runChangeOutput, error) {
	if target == nil {
		target = map[string]any{}
	}
	target["ids"] = []string{id}
	var state string
	_, err := s.change(ctx, "workflows."+action, target, func(tx pgx.Tx) (int64, error) {
		if err := fn(tx); err != nil {
			return 0, err
		}
		return 1, tx.QueryRow(ctx, sqlRunStateOf, id).Scan(&state)
	})
	if err != nil {
		return nil, s.runError(action+" workflow run", id, err)
	}
	return &runChangeOutput{Body: RunChange{ID: id, Action: action, State: state}}, nil
}

func (s *server) runError(what, id string, err error) error {
	switch {
	case errors.Is(err, workflow.ErrRunNotFound):
		return huma.Error404NotFound(fmt.Sprintf("workflow run %q not found", id))
	case errors.Is(err, workflow.ErrRunFinished):
		return huma.Error409Conflict(fmt.Sprintf("%s refused: run %q has finished", what, id))
	case errors.Is(err, workflow.ErrNotRetryable):
		return huma.Error409Conflict(fmt.Sprintf("%s refused: run %q is not failed (only a failed run can be retried; "+
			"a compensated or cancelled run has undone its work)", what, id))
	case errors.Is(err, workflow.ErrTooLarge), errors.Is(err, workflow.ErrTooDeep), errors.Is(err, workflow.ErrBadOptions):
		return huma.Error422UnprocessableEntity(fmt.Sprintf("%s refused: %v", what, err))
	}
	return s.internalError(what, err)
}

func (s *server) listRuns(ctx context.Context, in *listRunsInput) (*listRunsOutput, error) {
	c, err := decodeRunCursor(in.Cursor)
	if err != nil {
		return nil, err
	}
	f := runFilter{Workflow: in.Workflow, State: in.State, CreatedAfter: timePtr(in.CreatedAfter), CreatedBefore: timePtr(in.CreatedBefore), Tags: in.Tags}
	sql, args := sqlListRuns(f, c, in.Limit+1)
	rows, err := s.read.Query(ctx, sql, args...)
	if err != nil {
		return nil, s.internalError("list workflow runs", err)
	}
	items, err := pgx.CollectRows(rows, scanRun)
	if err != nil {
		return nil, s.internalError("list workflow runs", err)
	}
	out := &listRunsOutput{}
	out.Body.Items = items
	if len(items) > in.Limit {
		out.Body.Items = items[:in.Limit]
		last := items[in.Limit-1]
		out.Body.NextCursor = runCursor{Kind: "workflow-runs", At: last.CreatedAt, ID: last.ID}.encode()
	}
	return out, nil
}

func scanRun(r pgx.CollectableRow) (WorkflowRun, error) {
	var w WorkflowRun
	err := r.Scan(&w.ID, &w.Workflow, &w.State, &w.Queue, &w.ParentID, &w.Error, &w.CancelRequested, &w.Executions,
		&w.CreatedAt, &w.StartedAt, &w.FinishedAt, &w.Tags, &w.ParentClose)
	if w.Tags == nil {
		w.Tags = []string{}
	}
	if w.FinishedAt != nil {
		w.DurationMS = millis(w.CreatedAt, *w.FinishedAt)
	}
	return w, err
}

// nonNilTags is tags, or an empty list (the API's "tags": [] for none).
func nonNilTags(tags []string) []string {
	if tags == nil {
		return []string{}
	}
	return tags
}

func millis(from, to time.Time) *int64 {
	ms := max(to.Sub(from).Milliseconds(), 0)
	return &ms
}

func (s *server) getRun(ctx context.Context, in *runIDInput) (*runOutput, error) {
	run, err := workflow.Get(ctx, s.pool, in.ID)
	if err != nil {
		return nil, s.runError("get workflow run", in.ID, err)
	}
	d := WorkflowRunDetail{
		WorkflowRun: WorkflowRun{ID: run.ID, Workflow: run.Workflow, State: string(run.State), Queue: run.Queue,
			ParentID: run.ParentID, Error: run.Error, CancelRequested: run.CancelRequested, Executions: run.Executions,
			CreatedAt: run.CreatedAt, StartedAt: run.StartedAt, FinishedAt: run.FinishedAt, Tags: nonNilTags(run.Tags)},
		Input: run.Input, Output: run.Output, JobID: run.JobID, Generation: run.Generation,
		TraceID: traceID(run.TraceParent), Steps: []WorkflowStep{},
	}
	if run.FinishedAt != nil {
		d.DurationMS = millis(run.CreatedAt, *run.FinishedAt)
	}
	if d.TraceID != "" && s.cfg.TraceURL != "" {
		d.TraceURL = strings.ReplaceAll(s.cfg.TraceURL, "{trace_id}", d.TraceID)
	}
	for _, st := range run.Steps {
		ws := WorkflowStep{Position: st.Position, Key: st.Key, Kind: st.Kind, State: st.State,
			Compensation: strings.HasPrefix(st.Key, "compensate:"), Attempts: st.Attempts, Error: st.Error,
			StartedAt: st.StartedAt, FinishedAt: st.FinishedAt, WakeAt: st.WakeAt, ChildID: st.ChildID,
			OutputBytes: len(st.Output), AttemptLog: []WorkflowStepAttempt{}, AttemptLogError: st.AttemptLogError}
		for _, a := range st.AttemptLog {
			// An entry without its times (stored by an older version, or
			// written behind the API) is left out and said so: its zero
			// times, 0001-01-01, stretched the run page's time axis over
			// two thousand years.
			if a.StartedAt.IsZero() || a.FinishedAt.IsZero() {
				ws.AttemptLogError = cmp.Or(ws.AttemptLogError,
					fmt.Sprintf("attempt %d of the stored log has no start or end time; left out", a.Attempt))
				continue
			}
			ws.AttemptLog = append(ws.AttemptLog, WorkflowStepAttempt{Attempt: a.Attempt, StartedAt: a.StartedAt,
				FinishedAt: a.FinishedAt, DurationMS: a.FinishedAt.Sub(a.StartedAt).Milliseconds(), Error: a.Error})
		}
		if st.FinishedAt != nil {
			ws.DurationMS = millis(st.StartedAt, *st.FinishedAt)
		}
		if len(st.Output) <= maxStepOutputShown {
			ws.Output = st.Output
		}
		d.Steps = append(d.Steps, ws)
	}
	if err := s.read.QueryRow(ctx, sqlRunParentClose, in.ID).Scan(&d.ParentClose); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, s.internalError("get workflow run", err)
	}
	rows, err := s.read.Query(ctx, sqlRunHeartbeats, in.ID, maxStepOutputShown)
	if err != nil {
		return nil, s.internalError("get workflow run", err)
	}
	beats := map[int]*WorkflowStepHeartbeat{}
	var pos int
	var hb WorkflowStepHeartbeat
	var details *string
	if _, err := pgx.ForEachRow(rows, []any{&pos, &hb.Attempt, &hb.At, &hb.DetailsBytes, &details}, func() error {
		b := hb
		if details != nil {
			b.Details = json.RawMessage(*details)
		}
		beats[pos] = &b
		return nil
	}); err != nil {
		return nil, s.internalError("get workflow run", err)
	}
	for i := range d.Steps {
		d.Steps[i].Heartbeat = beats[d.Steps[i].Position]
	}
	rows, err = s.read.Query(ctx, sqlChildRuns, in.ID, 1000)
	if err != nil {
		return nil, s.internalError("get workflow run", err)
	}
	if d.Children, err = pgx.CollectRows(rows, scanRun); err != nil {
		return nil, s.internalError("get workflow run", err)
	}
	if d.Children == nil {
		d.Children = []WorkflowRun{}
	}
	rows, err = s.read.Query(ctx, sqlSetAsideSignals, in.ID, 100, maxStepOutputShown)
	if err != nil {
		return nil, s.internalError("get workflow run", err)
	}
	d.SetAsideSignals, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkflowSignal, error) {
		var sg WorkflowSignal
		var payload *string
		err := r.Scan(&sg.ID, &sg.Name, &sg.SentAt, &sg.SetAsideAt, &sg.DecodeError, &sg.PayloadBytes, &payload)
		if payload != nil {
			sg.Payload = json.RawMessage(*payload)
		}
		return sg, err
	})
	if err != nil {
		return nil, s.internalError("get workflow run", err)
	}
	if d.SetAsideSignals == nil {
		d.SetAsideSignals = []WorkflowSignal{}
	}
	rows, err = s.read.Query(ctx, sqlRunUpdates, in.ID, 100)
	if err != nil {
		return nil, s.internalError("get workflow run", err)
	}
	d.Updates, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkflowUpdate, error) {
		var u WorkflowUpdate
		return u, r.Scan(&u.ID, &u.Name, &u.State, &u.Error, &u.SentAt, &u.HandledAt)
	})
	if err != nil {
		return nil, s.internalError("get workflow run", err)
	}
	if d.Updates == nil {
		d.Updates = []WorkflowUpdate{}
	}
	return &runOutput{Body: d}, nil
}

// runCursor is a position in the list of runs: the last run of the previous
// page (run ids are text, so the jobs' integer cursor does not fit). It
// travels as opaque base64url JSON.
type runCursor struct {
	Kind string    `json:"k"`
	At   time.Time `json:"t"`
	ID   string    `json:"i"`
}

func (c runCursor) encode() string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeRunCursor reads a cursor of the runs list; "" is the first page.
func decodeRunCursor(s string) (*runCursor, error) {
	if s == "" {
		return nil, nil
	}
	bad := huma.Error422UnprocessableEntity("invalid cursor", &huma.ErrorDetail{
		Location: "query.cursor", Message: "not a cursor of this list (pass next_cursor from the previous page unchanged)", Value: s,
	})
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, bad
	}
	var c runCursor
	if err := json.Unmarshal(b, &c); err != nil || c.Kind != "workflow-runs" || c.ID == "" || c.At.IsZero() ||
		len(c.ID) > 255 || !cleanText(c.ID) || c.At.Year() < 1 || c.At.Year() > 9999 {
		return nil, bad
	}
	return &c, nil
}
