package workflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
)

// HistoryFormat is the version of the history export format that History
// writes and Replay reads. A change that an older reader would misread
// gets a new version; docs/workflow.md describes each.
const HistoryFormat = 1

// History is a run's exported history: what Replay needs to check new code
// against the run (its workflow, input and every checkpoint of its current
// generation, by position), and the timeline an operator reads. It encodes
// to the JSON documented in docs/workflow.md ("History export").
type History struct {
	// Format is HistoryFormat when written.
	Format int `json:"format"`
	// ExportedAt is the database's clock when the history was read.
	ExportedAt time.Time  `json:"exported_at"`
	Run        HistoryRun `json:"run"`
	// StepCount is how many steps were exported: a history holding fewer
	// is truncated.
	StepCount int           `json:"step_count"`
	Steps     []HistoryStep `json:"steps"`
}

// HistoryRun is the run of a History.
type HistoryRun struct {
	ID              string          `json:"id"`
	Workflow        string          `json:"workflow"`
	State           RunState        `json:"state"`
	Input           json.RawMessage `json:"input"`
	Output          json.RawMessage `json:"output,omitempty"`
	Error           string          `json:"error,omitempty"`
	ParentID        string          `json:"parent_id,omitempty"`
	Generation      int             `json:"generation"`
	CancelRequested bool            `json:"cancel_requested"`
	CreatedAt       time.Time       `json:"created_at"`
	StartedAt       *time.Time      `json:"started_at,omitempty"`
	FinishedAt      *time.Time      `json:"finished_at,omitempty"`
}

// HistoryStep is one checkpoint of a History.
type HistoryStep struct {
	Position int    `json:"position"`
	Key      string `json:"key"`
	Kind     string `json:"kind"`  // step, tx, sleep, signal, child, value, patch, event
	State    string `json:"state"` // completed, failed, retrying, waiting
	// Output is the step's output (a signal's payload, a child's output,
	// a recorded value), as stored.
	Output json.RawMessage `json:"output,omitempty"`
	Error  string          `json:"error,omitempty"`
	// ErrorInfo is what a failed step stores of its error for the
	// workflow to branch on (see "Errors a workflow branches on").
	ErrorInfo  json.RawMessage `json:"error_info,omitempty"`
	Attempts   int             `json:"attempts"`
	WakeAt     *time.Time      `json:"wake_at,omitempty"`
	ChildID    string          `json:"child_id,omitempty"`
	StartedAt  time.Time       `json:"started_at"`
	FinishedAt *time.Time      `json:"finished_at,omitempty"`
	AttemptLog []StepAttempt   `json:"attempt_log,omitempty"`
}

// sqlHistorySteps reads a run's steps for export: the timeline and what a
// replay needs (error_info).
const sqlHistorySteps = `
SELECT position, key, kind, state, coalesce(output::text, ''), coalesce(error, ''),
       coalesce(error_info::text, ''), attempts, wake_at, coalesce(child_id, ''), started_at, finished_at,
       attempt_log::text, now()
FROM relay_workflow_steps
WHERE run_id = $1
ORDER BY position`

// ReadHistory reads run id's history for export (ErrRunNotFound when there
// is none). A run in flight is exported as far as it got.
func ReadHistory(ctx context.Context, db core.DB, id string) (*History, error) {
	ex, err := dbx.For(db)
	if err != nil {
		return nil, fmt.Errorf("workflow: history of run %s: %w", id, err)
	}
	run, err := getRun(ctx, ex, id)
	if err != nil {
		return nil, fmt.Errorf("workflow: history of run %s: %w", id, err)
	}
	h := &History{Format: HistoryFormat, Steps: []HistoryStep{}, Run: HistoryRun{
		ID: run.ID, Workflow: run.Workflow, State: run.State, Input: run.Input, Output: run.Output, Error: run.Error,
		ParentID: run.ParentID, Generation: run.Generation, CancelRequested: run.CancelRequested,
		CreatedAt: run.CreatedAt, StartedAt: run.StartedAt, FinishedAt: run.FinishedAt}}
	err = ex.Query(ctx, sqlHistorySteps, []any{id}, func(r dbx.Scanner) error {
		var s HistoryStep
		var output, info, log string
		if err := r.Scan(&s.Position, &s.Key, &s.Kind, &s.State, &output, &s.Error, &info, &s.Attempts,
			&s.WakeAt, &s.ChildID, &s.StartedAt, &s.FinishedAt, &log, &h.ExportedAt); err != nil {
			return err
		}
		if output != "" {
			s.Output = json.RawMessage(output)
		}
		if info != "" {
			s.ErrorInfo = json.RawMessage(info)
		}
		var attempts []StepAttempt
		if json.Unmarshal([]byte(log), &attempts) == nil { // an unreadable log is left out, as Get's
			s.AttemptLog = realAttempts(attempts)
		}
		h.Steps = append(h.Steps, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("workflow: history of run %s: steps: %w", id, err)
	}
	if h.ExportedAt.IsZero() {
		h.ExportedAt = time.Now().UTC()
	}
	h.StepCount = len(h.Steps)
	return h, nil
}

// ErrBadHistory is matched (errors.Is) by every error about a history that
// cannot be replayed as given: another format version, a truncated or
// malformed one, one of a workflow the registry does not hold.
var ErrBadHistory = errors.New("workflow: bad history")

// DecodeHistories decodes the histories in r: one History as JSON, a JSON
// array of them, or several one after another (what `relay runs history`
// prints, concatenated). Each is checked as Replay checks it.
func DecodeHistories(r io.Reader) ([]*History, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("workflow: read histories: %w", err)
	}
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '[' {
		var hs []*History
		if err := json.Unmarshal(t, &hs); err != nil {
			return nil, fmt.Errorf("%w: decode the array of histories: %v", ErrBadHistory, err)
		}
		for i, h := range hs {
			if err := h.check(); err != nil {
				return nil, fmt.Errorf("history %d of the array: %w", i+1, err)
			}
		}
		return hs, nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var hs []*History
	for {
		var h History
		err := dec.Decode(&h)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, fmt.Errorf("%w: history %d is truncated (the JSON ends early: %v)", ErrBadHistory, len(hs)+1, err)
			}
			return nil, fmt.Errorf("%w: decode history %d: %v", ErrBadHistory, len(hs)+1, err)
		}
		if err := h.check(); err != nil {
			return nil, fmt.Errorf("history %d: %w", len(hs)+1, err)
		}
		hs = append(hs, &h)
	}
	if len(hs) == 0 {
		return nil, fmt.Errorf("%w: no history in the input", ErrBadHistory)
	}
	return hs, nil
}

// check reports what makes h unusable, naming it.
func (h *History) check() error {
	switch {
	case h == nil:
		return fmt.Errorf("%w: a null history", ErrBadHistory)
	case h.Format == 0:
		return fmt.Errorf("%w: no format version (\"format\"): not a run history exported by Relay?", ErrBadHistory)
	case h.Format != HistoryFormat:
		return fmt.Errorf("%w: run %s: format version %d, this version of Relay reads format %d", ErrBadHistory, h.Run.ID, h.Format, HistoryFormat)
	case h.Run.ID == "" || h.Run.Workflow == "":
		return fmt.Errorf("%w: no run id or workflow name (\"run\")", ErrBadHistory)
	case len(h.Steps) != h.StepCount:
		return fmt.Errorf("%w: run %s: truncated: %d steps of the %d exported", ErrBadHistory, h.Run.ID, len(h.Steps), h.StepCount)
	}
	for i, s := range h.Steps {
		if s.Position != i {
			return fmt.Errorf("%w: run %s: truncated or reordered: step %d of the history is at position %d", ErrBadHistory, h.Run.ID, i, s.Position)
		}
	}
	return nil
}
