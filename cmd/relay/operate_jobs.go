package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"reflect"
	"strconv"

	"github.com/relayq/relay/admin"
)

// jobFilter is the filter flags of relay jobs list and bulk.
type jobFilter struct {
	state, queue, kind, orderingKey                              string
	createdAfter, createdBefore, finalizedAfter, finalizedBefore timeFlag
}

func (f *jobFilter) add(fs *flag.FlagSet) {
	fs.StringVar(&f.state, "state", "", "only jobs in this state: queued, claimed, succeeded, dead, cancelled")
	fs.StringVar(&f.queue, "queue", "", "only jobs of this queue")
	fs.StringVar(&f.kind, "kind", "", "only jobs of this kind")
	fs.StringVar(&f.orderingKey, "ordering-key", "", "only jobs of this ordering key")
	fs.Var(&f.createdAfter, "created-after", "only jobs created at or after this RFC 3339 time")
	fs.Var(&f.createdBefore, "created-before", "only jobs created before this RFC 3339 time")
	fs.Var(&f.finalizedAfter, "finalized-after", "only jobs finished at or after this RFC 3339 time")
	fs.Var(&f.finalizedBefore, "finalized-before", "only jobs finished before this RFC 3339 time")
}

func (f *jobFilter) query() url.Values {
	q := url.Values{}
	setString(q, "state", f.state)
	setString(q, "queue", f.queue)
	setString(q, "kind", f.kind)
	setString(q, "ordering_key", f.orderingKey)
	setTime(q, "created_after", &f.createdAfter)
	setTime(q, "created_before", &f.createdBefore)
	setTime(q, "finalized_after", &f.finalizedAfter)
	setTime(q, "finalized_before", &f.finalizedBefore)
	return q
}

func (f *jobFilter) bulk() admin.BulkFilter {
	return admin.BulkFilter{State: f.state, Queue: f.queue, Kind: f.kind, OrderingKey: f.orderingKey,
		CreatedAfter: f.createdAfter.t, CreatedBefore: f.createdBefore.t,
		FinalizedAfter: f.finalizedAfter.t, FinalizedBefore: f.finalizedBefore.t}
}

// jobID is a job id argument, checked before any call.
func jobID(s string) (string, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return "", fmt.Errorf("job id %q: want a positive number", s)
	}
	return strconv.FormatInt(id, 10), nil
}

func runJobs(ctx context.Context, args []string) error {
	var filter jobFilter
	var limit int
	var cursor string
	var action string
	var dryRun bool
	var max int
	change := func(name, path, summary string) opCommand {
		return opCommand{name: name, args: []string{"ID"}, summary: summary,
			run: func(ctx context.Context, c *opCall) error {
				id, err := jobID(c.args[0])
				if err != nil {
					return err
				}
				var r admin.ChangeResult
				return c.post(ctx, "/v1/jobs/"+id+"/"+path, nil, &r, func() {
					fmt.Fprintf(c.w, "job %d: %s\n", r.ID, r.State)
				})
			}}
	}
	return runGroup(ctx, "jobs", "Find, read and change jobs through relay serve's admin API.", []opCommand{
		{name: "list", summary: "list jobs, newest first (a finished --state: newest finish first)",
			flags: func(fs *flag.FlagSet) {
				filter.add(fs)
				fs.IntVar(&limit, "limit", 50, "jobs per page (1-500)")
				fs.StringVar(&cursor, "cursor", "", "the page after the one that printed this cursor")
			},
			run: func(ctx context.Context, c *opCall) error {
				q := filter.query()
				q.Set("limit", strconv.Itoa(limit))
				setString(q, "cursor", cursor)
				var page struct {
					Items      []admin.Job `json:"items"`
					NextCursor string      `json:"next_cursor"`
				}
				return c.get(ctx, "/v1/jobs", q, &page, func() {
					rows := [][]string{{"ID", "KIND", "QUEUE", "STATE", "ATTEMPT", "RUN AT", "CREATED", "FINISHED", "LAST ERROR"}}
					for _, j := range page.Items {
						rows = append(rows, []string{strconv.FormatInt(j.ID, 10), j.Kind, j.Queue, j.State,
							fmt.Sprintf("%d/%d", j.Attempt, j.MaxAttempts), fmtTime(j.RunAt), fmtTime(j.CreatedAt),
							fmtTimePtr(j.FinalizedAt), cell(j.LastError, 60)})
					}
					c.table(rows)
					c.nextPage(page.NextCursor)
				})
			}},
		{name: "show", args: []string{"ID"}, summary: "show a job with its args, metadata and every attempt",
			run: func(ctx context.Context, c *opCall) error {
				id, err := jobID(c.args[0])
				if err != nil {
					return err
				}
				var j admin.JobDetail
				return c.get(ctx, "/v1/jobs/"+id, nil, &j, func() { printJob(c, &j) })
			}},
		change("retry", "retry-now", "make a job queued for later (a retry's backoff) runnable now"),
		change("cancel", "cancel", "cancel a queued or running job"),
		change("requeue", "requeue", "requeue a dead or cancelled job, runnable now"),
		{name: "delete", args: []string{"ID"}, summary: "delete a finished (succeeded, dead or cancelled) job",
			run: func(ctx context.Context, c *opCall) error {
				id, err := jobID(c.args[0])
				if err != nil {
					return err
				}
				var r admin.ChangeResult
				return c.delete(ctx, "/v1/jobs/"+id, &r, func() { fmt.Fprintf(c.w, "job %d: deleted\n", r.ID) })
			}},
		{name: "bulk", args: []string{"ACTION"},
			summary: "requeue, cancel or delete every job the filter flags match (--dry-run counts them)",
			flags: func(fs *flag.FlagSet) {
				filter.add(fs)
				fs.BoolVar(&dryRun, "dry-run", false, "count the matching jobs and change nothing")
				fs.IntVar(&max, "max", 0, "stop after this many jobs (default: the API's, 10000)")
			},
			run: func(ctx context.Context, c *opCall) error {
				action = c.args[0]
				if action != "requeue" && action != "cancel" && action != "delete" {
					return fmt.Errorf("bulk action %q: want requeue, cancel or delete", action)
				}
				if !dryRun && reflect.DeepEqual(filter.bulk(), admin.BulkFilter{}) { // a struct with a slice (tags): no ==
					return fmt.Errorf("bulk %s without a filter would change every job it applies to: "+
						"add filter flags (--state, --queue, --kind, ...), and run with --dry-run first", action)
				}
				body := map[string]any{"action": action, "filter": filter.bulk(), "dry_run": dryRun}
				if max != 0 {
					body["max"] = max
				}
				var r admin.BulkResult
				return c.post(ctx, "/v1/jobs/bulk", body, &r, func() {
					what := "changed"
					if r.DryRun {
						what = "would change (dry run)"
						r.Changed = r.Matched
					}
					fmt.Fprintf(c.w, "%s: %d matched, %s %d, %d skipped (moved on or locked), %d batches\n",
						r.Action, r.Matched, what, r.Changed, r.Skipped, r.Batches)
					if !r.Done {
						fmt.Fprintln(c.w, "not done: the server's time budget ran out; run the same command again to continue")
					}
				})
			}},
	}, args)
}

func printJob(c *opCall, j *admin.JobDetail) {
	c.fields(
		"id", strconv.FormatInt(j.ID, 10),
		"kind", j.Kind,
		"queue", j.Queue,
		"state", j.State,
		"priority", strconv.Itoa(j.Priority),
		"attempt", fmt.Sprintf("%d of %d", j.Attempt, j.MaxAttempts),
		"ordering key", j.OrderingKey,
		"run at", fmtTime(j.RunAt),
		"created", fmtTime(j.CreatedAt),
		"finished", fmtTimePtr(j.FinalizedAt),
		"trace", j.TraceID,
		"trace url", j.TraceURL,
		"last error", cell(j.LastError, 500),
		"args", compactJSON(j.Args),
		"metadata", compactJSON(j.Metadata),
	)
	if len(j.Attempts) == 0 {
		return
	}
	fmt.Fprintln(c.w, "\nattempts:")
	rows := [][]string{{"ATTEMPT", "OUTCOME", "WORKER", "STARTED", "FINISHED", "ERROR"}}
	for _, a := range j.Attempts {
		rows = append(rows, []string{strconv.Itoa(a.Attempt), a.Outcome, cell(a.Worker, 40), fmtTime(a.StartedAt),
			fmtTimePtr(a.FinishedAt), cell(a.Error, 100)})
	}
	c.table(rows)
}
