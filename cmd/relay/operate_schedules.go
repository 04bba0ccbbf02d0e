package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/relayq/relay/admin"
)

func runSchedules(ctx context.Context, args []string) error {
	var next, last int
	change := func(action, summary string) opCommand {
		return opCommand{name: action, args: []string{"NAME"}, summary: summary,
			run: func(ctx context.Context, c *opCall) error {
				var r admin.ScheduleChange
				return c.post(ctx, "/v1/schedules/"+segment(c.args[0])+"/"+action, nil, &r, func() {
					if r.JobID != 0 {
						fmt.Fprintf(c.w, "schedule %s: %s; job %d enqueued\n", r.Name, r.Action, r.JobID)
						return
					}
					fmt.Fprintf(c.w, "schedule %s: %s\n", r.Name, r.Action)
				})
			}}
	}
	return runGroup(ctx, "schedules", "Read and change cron schedules through relay serve's admin API.", []opCommand{
		{name: "list", summary: "list schedules with their next fires (in each schedule's time zone) and latest fire",
			flags: func(fs *flag.FlagSet) {
				fs.IntVar(&next, "next", 3, "coming fire times to show per schedule (1-20)")
			},
			run: func(ctx context.Context, c *opCall) error {
				var page struct {
					Items []admin.Schedule `json:"items"`
				}
				q := url.Values{"next": {strconv.Itoa(next)}, "last": {"1"}}
				return c.get(ctx, "/v1/schedules", q, &page, func() {
					rows := [][]string{{"NAME", "SPEC", "ZONE", "KIND", "QUEUE", "STATE", "NEXT FIRES", "LAST FIRE"}}
					for _, s := range page.Items {
						rows = append(rows, []string{s.Name, s.Spec, s.TimeZone, s.Kind, s.Queue, scheduleState(&s),
							nextFires(&s), lastFire(&s)})
					}
					c.table(rows)
				})
			}},
		{name: "show", args: []string{"NAME"}, summary: "show a schedule with its next fires and latest fires (with their jobs)",
			flags: func(fs *flag.FlagSet) {
				fs.IntVar(&next, "next", 5, "coming fire times to show (1-20)")
				fs.IntVar(&last, "last", 10, "latest fires to show (0-50)")
			},
			run: func(ctx context.Context, c *opCall) error {
				var s admin.Schedule
				q := url.Values{"next": {strconv.Itoa(next)}, "last": {strconv.Itoa(last)}}
				return c.get(ctx, "/v1/schedules/"+segment(c.args[0]), q, &s, func() { printSchedule(c, &s) })
			}},
		change("trigger", "enqueue the schedule's job now, as an extra fire"),
		change("pause", "pause a schedule (lasts across restarts)"),
		change("resume", "resume a paused schedule"),
	}, args)
}

func printSchedule(c *opCall, s *admin.Schedule) {
	c.fields(
		"name", s.Name,
		"namespace", s.Namespace,
		"spec", s.Spec,
		"time zone", s.TimeZone,
		"kind", s.Kind,
		"args", compactJSON(s.Args),
		"queue", s.Queue,
		"catch up", s.CatchUp,
		"overlap", s.Overlap,
		"state", scheduleState(s),
	)
	fmt.Fprintln(c.w, "\nnext fires ("+s.TimeZone+"):")
	for _, f := range strings.Split(nextFires(s), ", ") {
		fmt.Fprintln(c.w, "  "+f)
	}
	fmt.Fprintln(c.w, "\nlatest fires:")
	if len(s.LastFires) == 0 {
		fmt.Fprintln(c.w, "  none")
		return
	}
	rows := [][]string{{"FIRE TIME", "OUTCOME", "JOB", "RECORDED"}}
	for _, f := range s.LastFires {
		job := "-"
		if f.JobID != nil {
			job = strconv.FormatInt(*f.JobID, 10)
		}
		rows = append(rows, []string{fmtTime(f.FireTime), f.Outcome, job, fmtTime(f.RecordedAt)})
	}
	c.table(rows)
}

func scheduleState(s *admin.Schedule) string {
	var st []string
	if s.Paused {
		st = append(st, "paused")
	}
	if s.DisabledAt != nil {
		st = append(st, "disabled (not declared)")
	}
	if s.Broken {
		st = append(st, "broken: "+cell(s.BrokenError, 60))
	}
	if len(st) == 0 {
		return "active"
	}
	return strings.Join(st, ", ")
}

// nextFires are the schedule's coming fires in its own time zone, the
// one its spec speaks of ("0 18 L * *" fires at 18:00 there), each with
// its offset.
func nextFires(s *admin.Schedule) string {
	loc, err := time.LoadLocation(s.TimeZone)
	if err != nil {
		loc = time.Local
	}
	var out []string
	for _, t := range s.NextFires {
		out = append(out, t.In(loc).Format(timeLayout))
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ", ")
}

func lastFire(s *admin.Schedule) string {
	if len(s.LastFires) == 0 {
		return "-"
	}
	f := s.LastFires[0]
	out := fmtTime(f.FireTime) + " " + f.Outcome
	if f.JobID != nil {
		out += " (job " + strconv.FormatInt(*f.JobID, 10) + ")"
	}
	return out
}

func runQueues(ctx context.Context, args []string) error {
	var window int
	change := func(action, summary string) opCommand {
		return opCommand{name: action, args: []string{"NAME"}, summary: summary,
			run: func(ctx context.Context, c *opCall) error {
				var r admin.PauseResult
				return c.post(ctx, "/v1/queues/"+segment(c.args[0])+"/"+action, nil, &r, func() {
					now := map[bool]string{true: "paused", false: "running"}[r.Paused]
					if !r.Changed {
						now = "already " + now
					}
					fmt.Fprintf(c.w, "queue %s: %s\n", r.Queue, now)
				})
			}}
	}
	return runGroup(ctx, "queues", "Read, pause and resume queues through relay serve's admin API.", []opCommand{
		{name: "list", summary: "list queues with their backlog, running jobs, oldest wait and recent finishes",
			flags: func(fs *flag.FlagSet) {
				fs.IntVar(&window, "window", 15, "minutes of finishes to count (1-60)")
			},
			run: func(ctx context.Context, c *opCall) error {
				var page struct {
					Items []admin.Queue `json:"items"`
				}
				return c.get(ctx, "/v1/queues", url.Values{"window_minutes": {strconv.Itoa(window)}}, &page, func() {
					rows := [][]string{{"NAME", "STATE", "RUNNABLE", "SCHEDULED", "RUNNING", "OLDEST WAIT", "DEAD",
						fmt.Sprintf("SUCCEEDED/%dm", window), fmt.Sprintf("FAILED/%dm", window), "PROCESSES", "SLOTS"}}
					for _, q := range page.Items {
						state := "active"
						switch {
						case q.Paused:
							state = "paused"
							if q.PausedBy != "" {
								state += " by " + q.PausedBy
							}
						case q.Runnable > 0 && q.Processes == 0:
							// Its jobs wait for ever: the warning the
							// dashboard's overview gives.
							state = "active, no live process serves it"
						}
						rows = append(rows, []string{q.Name, state, strconv.FormatInt(q.Runnable, 10), strconv.FormatInt(q.Scheduled, 10),
							strconv.FormatInt(q.Running, 10), fmtDuration(time.Duration(q.OldestRunnableAgeSeconds * float64(time.Second))),
							strconv.FormatInt(q.Dead, 10), strconv.FormatInt(q.Succeeded, 10), strconv.FormatInt(q.Failed, 10),
							strconv.Itoa(q.Processes), strconv.Itoa(q.Slots)})
					}
					c.table(rows)
				})
			}},
		change("pause", "pause a queue: no worker claims its jobs (running ones finish)"),
		change("resume", "resume a paused queue"),
	}, args)
}

// processesCommand is relay processes: the live processes, from
// GET /v1/processes.
func processesCommand() opCommand {
	var role, queue string
	return opCommand{summary: "list the live processes: workers with their queues and slots, schedulers, dispatchers, servers",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&role, "role", "", "only processes of this role: worker, client, scheduler, dispatcher, serve")
			fs.StringVar(&queue, "queue", "", "only workers serving this queue")
		},
		run: func(ctx context.Context, c *opCall) error {
			q := url.Values{}
			setString(q, "role", role)
			setString(q, "queue", queue)
			var page struct {
				Items []admin.Process `json:"items"`
			}
			return c.get(ctx, "/v1/processes", q, &page, func() {
				rows := [][]string{{"ROLE", "NAME", "HOST", "PID", "QUEUES (SLOTS)", "DECLARES", "STARTED", "LAST SEEN", "VERSION"}}
				for _, p := range page.Items {
					var qs []string
					for _, q := range p.Queues {
						qs = append(qs, fmt.Sprintf("%s (%d)", q.Name, q.Slots))
					}
					declares := strings.Join(p.Declares, ", ")
					if p.Namespace != "" && declares != "" {
						declares = p.Namespace + ": " + declares
					}
					rows = append(rows, []string{p.Role, cell(p.Name, 40), p.Host, strconv.Itoa(p.PID), cell(strings.Join(qs, ", "), 60),
						cell(declares, 60), fmtTime(p.StartedAt), fmtTime(p.LastSeenAt), cell(p.Version, 60)})
				}
				c.table(rows)
			})
		}}
}
