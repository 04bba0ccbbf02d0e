package core

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// JobListParams filter JobList. The zero value lists the newest 100 jobs of
// every queue, kind and state.
type JobListParams struct {
	// Queue keeps jobs of this queue ("" for any).
	Queue string
	// Kinds keeps jobs of any of these kinds (none: any kind).
	Kinds []string
	// States keeps jobs in any of these states (none: any state).
	States []JobState
	// Tags keeps jobs that carry every one of these tags (none: any job).
	// Tagged jobs are found through an index of tagged rows only.
	Tags []string
	// BeforeID lists jobs with smaller ids only: pass the last id of a page
	// to get the next one. 0 starts from the newest.
	BeforeID int64
	// Limit caps the jobs returned: default 100, at most 10,000.
	Limit int
}

// JobList lists jobs, newest (highest id) first, filtered by p (nil for
// none). It reads through db like JobGet, a caller's transaction included.
func JobList(ctx context.Context, db DB, p *JobListParams) ([]*JobRow, error) {
	ex, err := execerFor(db)
	if err != nil {
		return nil, err
	}
	if p == nil {
		p = &JobListParams{}
	}
	limit := p.Limit
	switch {
	case limit < 0 || limit > 10000:
		return nil, &ValidationError{Field: "limit", Reason: fmt.Sprintf("%d is outside 0..10000", limit)}
	case limit == 0:
		limit = 100
	}
	if p.BeforeID < 0 {
		return nil, &ValidationError{Field: "before id", Reason: "negative"}
	}
	for _, s := range [][]string{{p.Queue}, p.Kinds, p.Tags} {
		for _, v := range s {
			if err := validateName("filter", v, 500); err != nil {
				return nil, err
			}
		}
	}
	kinds, _ := json.Marshal(nonNil(p.Kinds))
	states, _ := json.Marshal(nonNil(p.States))
	tags, _ := json.Marshal(nonNil(p.Tags))
	var out []*JobRow
	err = ex.Query(ctx, sqlListJobs, []any{p.Queue, string(kinds), string(states), string(tags), len(p.Tags) > 0, p.BeforeID, limit},
		func(r scanner) error {
			j, err := scanJobRow(r)
			if err != nil {
				return err
			}
			out = append(out, j)
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("core: list jobs: %w", err)
	}
	return out, nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// scanJobRow reads a row of jobColumns.
func scanJobRow(r scanner) (*JobRow, error) {
	j := &JobRow{}
	var state, args, meta, hist, tags string
	var prio int
	var runAt, createdAt, attemptedAt *time.Time
	if err := r.Scan(&j.ID, &j.Kind, &j.Queue, &state, &prio, &j.Attempt, &j.MaxAttempts, &runAt, &createdAt,
		&attemptedAt, &j.AttemptedBy, &j.FinalizedAt, &j.LastError, &args, &meta, &hist, &j.OrderingKey, &tags); err != nil {
		return nil, err
	}
	j.State, j.Priority = JobState(state), prio
	for _, t := range []struct{ src, dst *time.Time }{{runAt, &j.RunAt}, {createdAt, &j.CreatedAt}, {attemptedAt, &j.AttemptedAt}} {
		if t.src != nil {
			*t.dst = *t.src
		}
	}
	j.EncodedArgs, j.Metadata = json.RawMessage(args), json.RawMessage(meta)
	if err := json.Unmarshal([]byte(tags), &j.Tags); err != nil {
		return nil, fmt.Errorf("decode tags of job %d: %w", j.ID, err)
	}
	if len(j.Tags) == 0 {
		j.Tags = nil
	}
	if err := json.Unmarshal([]byte(hist), &j.History); err != nil {
		return nil, fmt.Errorf("decode history of job %d: %w", j.ID, err)
	}
	return j, nil
}
