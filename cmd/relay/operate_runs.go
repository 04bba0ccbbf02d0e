package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/relayq/relay/admin"
)

func runRuns(ctx context.Context, args []string) error {
	var workflow, state, cursor string
	var createdAfter, createdBefore timeFlag
	var limit int
	change := func(name, summary string) opCommand {
		return opCommand{name: name, args: []string{"ID"}, summary: summary,
			run: func(ctx context.Context, c *opCall) error {
				return runChange(ctx, c, name, nil)
			}}
	}
	return runGroup(ctx, "runs", "Find, read and change workflow runs through relay serve's admin API.", []opCommand{
		{name: "list", summary: "list workflow runs, newest first",
			flags: func(fs *flag.FlagSet) {
				fs.StringVar(&workflow, "workflow", "", "only runs of this workflow")
				fs.StringVar(&state, "state", "", "only runs in this state: pending, running, compensating, completed, failed, compensated, cancelled, terminated")
				fs.Var(&createdAfter, "created-after", "only runs created at or after this RFC 3339 time")
				fs.Var(&createdBefore, "created-before", "only runs created before this RFC 3339 time")
				fs.IntVar(&limit, "limit", 50, "runs per page (1-500)")
				fs.StringVar(&cursor, "cursor", "", "the page after the one that printed this cursor")
			},
			run: func(ctx context.Context, c *opCall) error {
				q := url.Values{"limit": {strconv.Itoa(limit)}}
				setString(q, "workflow", workflow)
				setString(q, "state", state)
				setTime(q, "created_after", &createdAfter)
				setTime(q, "created_before", &createdBefore)
				setString(q, "cursor", cursor)
				var page struct {
					Items      []admin.WorkflowRun `json:"items"`
					NextCursor string              `json:"next_cursor"`
				}
				return c.get(ctx, "/v1/workflows/runs", q, &page, func() {
					c.table(runRows(page.Items))
					c.nextPage(page.NextCursor)
				})
			}},
		{name: "show", args: []string{"ID"}, summary: "show a run with its step timeline, children and set-aside signals",
			run: func(ctx context.Context, c *opCall) error {
				var r admin.WorkflowRunDetail
				return c.get(ctx, "/v1/workflows/runs/"+segment(c.args[0]), nil, &r, func() { printRun(c, &r) })
			}},
		{name: "signal", args: []string{"ID", "NAME", "[JSON]"}, summary: "send signal NAME with a JSON payload (default null) to a run",
			run: func(ctx context.Context, c *opCall) error {
				body := map[string]any{"name": c.args[1]}
				if p := c.args[2]; p != "" {
					if !json.Valid([]byte(p)) {
						return fmt.Errorf("signal payload %q is not JSON (a string is quoted: '\"yes\"')", cell(p, 80))
					}
					body["payload"] = json.RawMessage(p)
				}
				return runChange(ctx, c, "signal", body)
			}},
		change("cancel", "cancel a run and its unfinished children (their compensations run)"),
		{name: "terminate", args: []string{"ID", "REASON"}, summary: "end a run now, without its compensations (cancel is the stop that undoes)",
			run: func(ctx context.Context, c *opCall) error {
				return runChange(ctx, c, "terminate", map[string]string{"reason": c.args[1]})
			}},
		change("retry", "run a failed run again from its failed step"),
		runsHistory(),
	}, args)
}

// runChange posts a change to run c.args[0] and prints what it did.
func runChange(ctx context.Context, c *opCall, action string, body any) error {
	var r admin.RunChange
	return c.post(ctx, "/v1/workflows/runs/"+segment(c.args[0])+"/"+action, body, &r, func() {
		fmt.Fprintf(c.w, "run %s: %s; now %s\n", r.ID, r.Action, r.State)
	})
}

func runRows(runs []admin.WorkflowRun) [][]string {
	rows := [][]string{{"ID", "WORKFLOW", "STATE", "QUEUE", "CREATED", "FINISHED", "DURATION", "ERROR"}}
	for _, r := range runs {
		state := r.State
		if r.CancelRequested && !strings.Contains("completed failed compensated cancelled terminated", state) {
			state += " (cancel requested)"
		}
		rows = append(rows, []string{r.ID, r.Workflow, state, r.Queue, fmtTime(r.CreatedAt), fmtTimePtr(r.FinishedAt),
			fmtMS(r.DurationMS), cell(r.Error, 60)})
	}
	return rows
}

// printRun prints a run, its step timeline in the order of its code path,
// its children and the signals it set aside.
func printRun(c *opCall, r *admin.WorkflowRunDetail) {
	job := ""
	if r.JobID != 0 {
		job = strconv.FormatInt(r.JobID, 10)
	}
	c.fields(
		"id", r.ID,
		"workflow", r.Workflow,
		"state", r.State,
		"queue", r.Queue,
		"parent", r.ParentID,
		"job", job,
		"executions", strconv.Itoa(r.Executions),
		"generation", strconv.Itoa(r.Generation),
		"created", fmtTime(r.CreatedAt),
		"started", fmtTimePtr(r.StartedAt),
		"finished", fmtTimePtr(r.FinishedAt),
		"duration", strings.TrimPrefix(fmtMS(r.DurationMS), "-"),
		"cancel", map[bool]string{true: "requested"}[r.CancelRequested],
		"trace", r.TraceID,
		"trace url", r.TraceURL,
		"error", cell(r.Error, 500),
		"input", compactJSON(r.Input),
		"output", strings.TrimPrefix(compactJSON(r.Output), "-"),
	)
	fmt.Fprintln(c.w, "\nsteps:")
	if len(r.Steps) == 0 {
		fmt.Fprintln(c.w, "  none yet")
	} else {
		rows := [][]string{{"#", "KEY", "KIND", "STATE", "ATTEMPTS", "STARTED", "DURATION", "DETAIL"}}
		for _, s := range r.Steps {
			rows = append(rows, []string{strconv.Itoa(s.Position), s.Key, s.Kind, s.State, strconv.Itoa(s.Attempts),
				fmtTime(s.StartedAt), fmtMS(s.DurationMS), stepDetail(&s)})
		}
		c.table(rows)
	}
	if len(r.Children) > 0 {
		fmt.Fprintln(c.w, "\nchildren:")
		c.table(runRows(r.Children))
	}
	if len(r.SetAsideSignals) > 0 {
		fmt.Fprintln(c.w, "\nsignals set aside (their payload did not decode):")
		rows := [][]string{{"ID", "NAME", "SENT", "BYTES", "WHY"}}
		for _, s := range r.SetAsideSignals {
			rows = append(rows, []string{strconv.FormatInt(s.ID, 10), s.Name, fmtTime(s.SentAt), strconv.Itoa(s.PayloadBytes), cell(s.DecodeError, 80)})
		}
		c.table(rows)
	}
}

// stepDetail is what a step's row says beyond its state: the error of a
// failed or retrying step, what a wait waits for, a child's id.
func stepDetail(s *admin.WorkflowStep) string {
	var parts []string
	if s.Compensation {
		parts = append(parts, "compensation")
	}
	if s.ChildID != "" {
		parts = append(parts, "child "+s.ChildID)
	}
	if s.WakeAt != nil && s.FinishedAt == nil {
		parts = append(parts, "wakes "+fmtTime(*s.WakeAt))
	}
	if s.Error != "" {
		parts = append(parts, "error: "+cell(s.Error, 80))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}
