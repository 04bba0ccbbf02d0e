package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/dbx"
)

// Cancel asks run id, and its unfinished child runs, to cancel, through db
// (joining its transaction). Each is woken: a sleeping or waiting run
// stops waiting, a running one starts no step after the one running; its
// registered compensations run, newest first, and it ends cancelled. Once
// Cancel returned nil (and db's transaction committed) the run never ends
// completed, even if its function had returned: the database refuses that
// outcome while a cancel is requested. Cancelling a finished run is
// ErrRunFinished, naming the state it ended in.
func Cancel(ctx context.Context, db core.DB, id string) error {
	err := inTx(ctx, db, func(tx core.DB) error {
		ex, err := dbx.For(tx)
		if err != nil {
			return err
		}
		n, err := requestCancel(ctx, ex, id)
		if err == nil && n == 0 {
			return runMissing(ctx, ex, id)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("workflow: cancel run %s: %w", id, err)
	}
	return nil
}

// requestCancel asks run id and its unfinished descendants to cancel, and
// wakes them, in ex's transaction; it returns how many runs it asked.
func requestCancel(ctx context.Context, ex dbx.Execer, id string) (int, error) {
	var n int
	if err := ex.Query(ctx, sqlRequestCancel, []any{id}, func(r dbx.Scanner) error { return r.Scan(&n) }); err != nil {
		return 0, fmt.Errorf("request cancel: %w", err)
	}
	return n, nil
}

// Retry runs a failed run again, with a new execution job, from the point
// that failed it. Completed steps are kept and not repeated, with one
// exception: when the run failed because its function returned a failed
// step's *StepError (or a child's *ChildError), that step and the plain
// steps after it are dropped and run again. A completed StepTx or consumed
// signal wait is never dropped, nor anything before one: if one completed
// after the failed step, the run replays to the same error unless its code
// changed. A run failed by its function's own error, a non-determinism, a
// crash loop or a dead job keeps its whole history. A run that failed in
// its compensations runs again only the compensations that failed: the
// step that failed the run and the compensations that completed are kept;
// if it was cancelled, it stays cancelled (its function does not go on)
// and ends cancelled. A run that is not failed is ErrNotRetryable.
func Retry(ctx context.Context, db core.DB, id string) error {
	err := inTx(ctx, db, func(tx core.DB) error {
		ex, err := dbx.For(tx)
		if err != nil {
			return err
		}
		var job int64
		var from *int
		found := false
		if err := ex.Query(ctx, sqlRetryRun, []any{id}, func(r dbx.Scanner) error { found = true; return r.Scan(&job, &from) }); err != nil {
			return err
		}
		if !found {
			if err := runMissing(ctx, ex, id); err == ErrRunNotFound {
				return err
			}
			return ErrNotRetryable
		}
		if _, err := ex.Exec(ctx, sqlRetryDropFailedCompensations, id); err != nil {
			return fmt.Errorf("drop failed compensations: %w", err)
		}
		if _, err := ex.Exec(ctx, sqlRetryDropSteps, id, from); err != nil {
			return fmt.Errorf("drop steps from position %v: %w", from, err)
		}
		if _, err := ex.Exec(ctx, sqlDropStaleHeartbeats, id); err != nil {
			return fmt.Errorf("drop the heartbeats of dropped steps: %w", err)
		}
		run, err := getRun(ctx, ex, id)
		if err != nil {
			return err
		}
		var trace map[string]any
		json.Unmarshal([]byte(run.traceJSON), &trace) //nolint:errcheck // best effort: a retry without trace context is still a retry
		meta := runJobMetadata(id, trace)
		// The new job is placed as the run's previous one was (Start's
		// Priority and MaxAttempts), unless that job is gone.
		priority, maxAttempts := 0, DefaultMaxAttempts+failReserve
		if err := ex.Query(ctx, sqlJobPlacement, []any{job}, func(r dbx.Scanner) error { return r.Scan(&priority, &maxAttempts) }); err != nil {
			return err
		}
		res, err := core.Enqueue(ctx, tx, runArgs{RunID: id}, &core.EnqueueOpts{Queue: run.Queue, Metadata: meta, Priority: &priority, MaxAttempts: maxAttempts})
		if err != nil {
			return err
		}
		_, err = ex.Exec(ctx, sqlSetRunJob, id, res.ID)
		return err
	})
	if err != nil {
		return fmt.Errorf("workflow: retry run %s: %w", id, err)
	}
	return nil
}

// Run is a run as stored, for inspection.
type Run struct {
	ID              string
	Workflow        string
	State           RunState
	Input           json.RawMessage
	Output          json.RawMessage // nil unless completed
	Error           string
	Queue           string
	JobID           int64 // the core job executing the run
	ParentID        string
	CancelRequested bool
	Generation      int // ContinueAsNew count
	Executions      int // executions that wrote something
	CreatedAt       time.Time
	StartedAt       *time.Time
	FinishedAt      *time.Time
	// Tags are the run's tags (StartOpts.Tags, AddTags), nil for none.
	Tags []string
	// TraceParent is the run's root trace context (W3C), "" if untraced.
	TraceParent string
	// Steps is the run's timeline, by position (Get only).
	Steps []StepInfo

	traceJSON string
}

// StepInfo is one checkpoint of a run's timeline.
type StepInfo struct {
	Position   int
	Key        string
	Kind       string // step, tx, sleep, signal, child, value, patch, event, tags
	State      string // completed, failed, retrying, waiting
	Output     json.RawMessage
	Error      string
	Attempts   int
	WakeAt     *time.Time
	ChildID    string
	StartedAt  time.Time
	FinishedAt *time.Time
	// AttemptLog is the step's attempts, oldest first: the latest 20 that
	// ran the step's function (Step, StepTx, Go, compensations), each with
	// its start and end on the executing worker's clock and its error.
	AttemptLog []StepAttempt
	// AttemptLogError is why the stored attempt log could not be read (a
	// value of another shape, written behind the API): AttemptLog is then
	// empty, and the rest of the timeline is read as usual.
	AttemptLogError string
}

// realAttempts drops the empty entries (null in JSON) that steps written
// without an attempt (values, children) got in their attempt log before
// sqlUpsertStep stopped appending them: no attempt is numbered 0.
func realAttempts(log []StepAttempt) []StepAttempt {
	out := log[:0]
	for _, a := range log {
		if a.Attempt != 0 {
			out = append(out, a)
		}
	}
	return out
}

func scanRun(r dbx.Scanner) (*Run, error) {
	run := &Run{}
	var input, output, state, tags string
	if err := r.Scan(&run.ID, &run.Workflow, &state, &input, &output, &run.Error, &run.Queue, &run.JobID,
		&run.ParentID, &run.traceJSON, &run.CancelRequested, &run.Generation, &run.Executions,
		&run.CreatedAt, &run.StartedAt, &run.FinishedAt, &tags); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(tags), &run.Tags); err != nil {
		return nil, fmt.Errorf("decode tags of run %s: %w", run.ID, err)
	}
	if len(run.Tags) == 0 {
		run.Tags = nil
	}
	run.State = RunState(state)
	run.Input = json.RawMessage(input)
	if output != "" {
		run.Output = json.RawMessage(output)
	}
	var tc map[string]string
	if json.Unmarshal([]byte(run.traceJSON), &tc) == nil {
		run.TraceParent = tc["traceparent"]
	}
	return run, nil
}

func getRun(ctx context.Context, ex dbx.Execer, id string) (*Run, error) {
	var run *Run
	err := ex.Query(ctx, sqlGetRun, []any{id}, func(r dbx.Scanner) error {
		var err error
		run, err = scanRun(r)
		return err
	})
	if err != nil {
		return nil, err
	}
	if run == nil {
		return nil, ErrRunNotFound
	}
	return run, nil
}

// Get reads run id with its step timeline.
func Get(ctx context.Context, db core.DB, id string) (*Run, error) {
	ex, err := dbx.For(db)
	if err != nil {
		return nil, fmt.Errorf("workflow: get run %s: %w", id, err)
	}
	run, err := getRun(ctx, ex, id)
	if err != nil {
		return nil, fmt.Errorf("workflow: get run %s: %w", id, err)
	}
	err = ex.Query(ctx, sqlStepTimeline, []any{id}, func(r dbx.Scanner) error {
		var s StepInfo
		var output, log string
		if err := r.Scan(&s.Position, &s.Key, &s.Kind, &s.State, &output, &s.Error, &s.Attempts,
			&s.WakeAt, &s.ChildID, &s.StartedAt, &s.FinishedAt, &log); err != nil {
			return err
		}
		if err := json.Unmarshal([]byte(log), &s.AttemptLog); err != nil {
			// The step's own field, not the whole run's timeline.
			s.AttemptLog, s.AttemptLogError = nil, fmt.Sprintf("decode attempt log of step %q: %v", s.Key, err)
		}
		s.AttemptLog = realAttempts(s.AttemptLog)
		if output != "" {
			s.Output = json.RawMessage(output)
		}
		run.Steps = append(run.Steps, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("workflow: get run %s: steps: %w", id, err)
	}
	return run, nil
}

// ListOpts filter and page List. The zero value lists the newest 100 runs.
type ListOpts struct {
	Workflow string
	State    RunState
	// Tags keeps the runs carrying every one of these tags (none: any run).
	Tags []string
	// Limit is at most 1000. Default 100.
	Limit int
	// After continues a listing after this run (the last of a page).
	After *Run
}

// List lists runs, newest first, without their steps.
func List(ctx context.Context, db core.DB, opts *ListOpts) ([]*Run, error) {
	var o ListOpts
	if opts != nil {
		o = *opts
	}
	if o.Limit <= 0 {
		o.Limit = 100
	}
	o.Limit = min(o.Limit, 1000)
	ex, err := dbx.For(db)
	if err != nil {
		return nil, fmt.Errorf("workflow: list runs: %w", err)
	}
	var afterAt *time.Time
	afterID := ""
	if o.After != nil {
		afterAt, afterID = &o.After.CreatedAt, o.After.ID
	}
	q, args := sqlListRuns, []any{o.Workflow, string(o.State), afterAt, afterID, o.Limit}
	if len(o.Tags) > 0 {
		tags, err := checkTags(o.Tags)
		if err != nil {
			return nil, fmt.Errorf("workflow: list runs: %w", err)
		}
		enc, _ := json.Marshal(tags)
		q, args = sqlListTaggedRuns, append(args, string(enc))
	}
	var runs []*Run
	err = ex.Query(ctx, q, args, func(r dbx.Scanner) error {
		run, err := scanRun(r)
		if err != nil {
			return err
		}
		runs = append(runs, run)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("workflow: list runs: %w", err)
	}
	return runs, nil
}

// Delete deletes a finished run with its child runs (and theirs), and their
// steps, signals and events, in one statement (retention). Its id may then
// be used by a new run, which starts with an empty history and whose
// children start anew. An unfinished run, or one with a child not yet
// finished (a child is cancelled when its parent ends, and may still be
// running its compensations), is not deleted: an error (cancel it first,
// or try again). DeleteFinished deletes by age.
func Delete(ctx context.Context, db core.DB, id string) error {
	ex, err := dbx.For(db)
	if err != nil {
		return fmt.Errorf("workflow: delete run %s: %w", id, err)
	}
	n, err := ex.Exec(ctx, sqlDeleteRun, id)
	if err != nil {
		return fmt.Errorf("workflow: delete run %s: %w", id, err)
	}
	if n == 0 {
		err := runMissing(ctx, ex, id)
		switch {
		case err == ErrRunNotFound:
			return fmt.Errorf("workflow: delete run %s: %w", id, err)
		case errors.Is(err, ErrRunFinished):
			return fmt.Errorf("workflow: delete run %s: a child run of it has not finished yet", id)
		case err != nil:
			return fmt.Errorf("workflow: delete run %s: %w", id, err)
		}
		return fmt.Errorf("workflow: delete run %s: the run has not finished", id)
	}
	return nil
}

// DeleteFinished deletes up to limit runs (default 1000) that finished
// more than age ago, with their steps, signals and events, and returns how
// many it deleted: call it periodically for retention. Children of runs
// still in flight are kept.
func DeleteFinished(ctx context.Context, db core.DB, age time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		limit = 1000
	}
	ex, err := dbx.For(db)
	if err != nil {
		return 0, fmt.Errorf("workflow: delete finished runs: %w", err)
	}
	n, err := ex.Exec(ctx, sqlDeleteFinished, max(age, 0).Microseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("workflow: delete finished runs: %w", err)
	}
	return n, nil
}
