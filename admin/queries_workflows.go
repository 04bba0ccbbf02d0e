package admin

import (
	"fmt"
	"strings"
	"time"
)

// The workflow endpoints' own reads. Changes (cancel, retry, signal) go
// through the workflow package, in the audit row's transaction.

const runColumns = `id, workflow, state, queue, coalesce(parent_id, ''), left(coalesce(error, ''), 1000),
       cancel_requested, executions, created_at, started_at, finished_at, tags,
       CASE WHEN parent_id IS NOT NULL THEN coalesce(parent_close, 'cancel') ELSE '' END`

// runFilter is a validated filter over workflow runs.
type runFilter struct {
	Workflow, State             string
	CreatedAfter, CreatedBefore *time.Time
	Tags                        []string // runs carrying every one
}

// sqlListRuns lists runs newest first after a (created_at, id) cursor. The
// WHERE clause holds only the conditions given (fixed strings; only the
// placeholder numbers vary), so each filter gets a plan of its own: an
// unfinished state walks relay_workflow_runs_unfinished_idx backwards, a
// state ended with an error relay_workflow_runs_error_idx, completed or no
// state relay_workflow_runs_list_idx (created_at, id); each stops at the
// page (TestWorkflowRunListUsesIndex). Tags can read
// relay_workflow_runs_tags_idx, which holds only tagged runs (its
// predicate is repeated so that the planner may).
func sqlListRuns(f runFilter, after *runCursor, limit int) (string, []any) {
	var args []any
	var conds []string
	add := func(cond string, v ...any) {
		n := make([]any, len(v))
		for i := range v {
			args = append(args, v[i])
			n[i] = len(args)
		}
		conds = append(conds, fmt.Sprintf(cond, n...))
	}
	if f.Workflow != "" {
		add("workflow = $%d", f.Workflow)
	}
	if f.State != "" {
		add("state = $%d", f.State)
		if c := stateIndexCond(f.State); c != "" {
			conds = append(conds, c)
		}
	}
	if len(f.Tags) > 0 {
		add("tags @> $%d::text[] AND tags <> '{}'", f.Tags)
	}
	if f.CreatedAfter != nil {
		add("created_at >= $%d", *f.CreatedAfter)
	}
	if f.CreatedBefore != nil {
		add("created_at < $%d", *f.CreatedBefore)
	}
	if after != nil {
		add("(created_at, id) < ($%d, $%d)", after.At, after.ID)
	}
	w := "true"
	if len(conds) > 0 {
		w = strings.Join(conds, " AND ")
	}
	args = append(args, limit)
	return fmt.Sprintf(`SELECT %s FROM relay_workflow_runs WHERE %s ORDER BY created_at DESC, id DESC LIMIT $%d`,
		runColumns, w, len(args)), args
}

// sqlSetAsideSignals lists run $1's set-aside signals (payloads a
// WaitSignal could not decode), oldest first, up to $2; a payload over $3
// bytes is left out. relay_workflow_signals_set_aside_idx holds exactly
// them.
const sqlSetAsideSignals = `
SELECT id, name, created_at, consumed_at, decode_error, octet_length(payload::text),
       CASE WHEN octet_length(payload::text) <= $3 THEN payload::text END
FROM relay_workflow_signals
WHERE run_id = $1 AND decode_error IS NOT NULL
ORDER BY id LIMIT $2`

// sqlRunHeartbeats reads run $1's latest heartbeat of each step
// (workflow.Heartbeat: its attempt, time and details, a detail over $2
// bytes left out): the range of the table's primary key for the run.
const sqlRunHeartbeats = `
SELECT h.position, h.attempt, h.at, octet_length(h.details::text),
       CASE WHEN octet_length(h.details::text) <= $2 THEN h.details::text END
FROM relay_workflow_heartbeats h WHERE h.run_id = $1`

// sqlRunParentClose reads run $1's parent-close policy: empty for a run that
// is no child; a child's stored NULL is the default, cancel.
const sqlRunParentClose = `
SELECT CASE WHEN parent_id IS NOT NULL THEN coalesce(parent_close, 'cancel') ELSE '' END
FROM relay_workflow_runs WHERE id = $1`

// sqlRunUpdates lists run $1's update requests newest first, up to $2
// (relay_workflow_updates_run_idx).
const sqlRunUpdates = `
SELECT id, name, state, left(coalesce(error, ''), 1000), created_at, handled_at
FROM relay_workflow_updates WHERE run_id = $1
ORDER BY id DESC LIMIT $2`

// sqlChildRuns lists a run's child runs in the order they were started
// (relay_workflow_runs_parent_idx), up to $2.
const sqlChildRuns = `
SELECT ` + runColumns + `
FROM relay_workflow_runs WHERE parent_id = $1
ORDER BY created_at, id LIMIT $2`

// stateIndexCond is the condition that lets a list or count of the runs in
// state read the partial index holding them: the run's state is in no
// index, so that a run's updates while it executes are HOT (migration
// 20261201000005_workflow_rows). Empty for completed (the most runs).
func stateIndexCond(state string) string {
	switch state {
	case "pending", "running", "compensating":
		return "finished_at IS NULL"
	case "failed", "compensated", "cancelled", "terminated":
		return "error IS NOT NULL"
	}
	return ""
}

// sqlCountRunsOfState counts the runs in state, up to $1 (the overview's
// failed, compensating, running and pending runs), on the partial index
// that holds them (stateIndexCond).
func sqlCountRunsOfState(state string) (string, []any) {
	w := "state = $1"
	if c := stateIndexCond(state); c != "" {
		w += " AND " + c
	}
	return `SELECT count(*) FROM (SELECT 1 FROM relay_workflow_runs WHERE ` + w + ` LIMIT $2) AS matched`, []any{state}
}

// sqlRunStateOf reads a run's state (after a change, in its transaction).
const sqlRunStateOf = `SELECT state FROM relay_workflow_runs WHERE id = $1`
