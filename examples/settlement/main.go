// Command settlement is Relay's month-end example: a settlement scheduled at
// 02:00 New York time on the last day of every month (`0 2 L * *`), which
// the scheduler starts as a workflow (lock-ledger, compute,
// write-settlement, notify) whose run id is derived from the fire time.
//
//	go run ./examples/settlement -next 5   # print the next five fire times
//	go run ./examples/settlement           # declare, trigger twice, start a fire twice, settle once
//
// It uses $DATABASE_URL, or starts a throwaway PostgreSQL when that is empty.
// On $DATABASE_URL it works in a schema of its own, relay_example_settlement,
// dropped and created afresh at each run (and left afterwards for you to
// inspect), so it runs again and again on a shared database.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/devdb"
	"github.com/relayq/relay/scheduler"
	"github.com/relayq/relay/workflow"
)

// The schedule: 02:00 on the last day of each month, New York time.
const (
	spec         = "0 2 L * *"
	timeZone     = "America/New_York"
	scheduleName = "month-end-settlement"
	workflowName = "settlement"
)

// SettleInput is the workflow's input: the ledger comes from the
// schedule's StartArgs, the fire time from the fire (StartArgs.FireTimeKey),
// so the period is the month of the fire, not of the clock when it runs.
type SettleInput struct {
	Ledger   string    `json:"ledger"`
	FireTime time.Time `json:"fire_time"`
	// WaitForMonthEnd, on a run started ahead of the period's end (an
	// operator opening the settlement early, say), makes the run sleep
	// until the last day of the fire's month, 02:00 New York time, as the
	// schedule would have fired: a durable timer, no process waits.
	WaitForMonthEnd bool `json:"wait_for_month_end,omitempty"`
}

// monthEnd is 02:00 on the last day of t's month in loc: when the schedule
// fires for that month.
func monthEnd(t time.Time, loc *time.Location) time.Time {
	t = t.In(loc)
	return time.Date(t.Year(), t.Month()+1, 0, 2, 0, 0, 0, loc)
}

// Settlement is the workflow's output.
type Settlement struct {
	Ledger    string `json:"ledger"`
	Period    string `json:"period"`
	Entries   int    `json:"entries"`
	Total     int64  `json:"total"`
	SettledBy string `json:"settled_by"` // the run that wrote the row
}

// Totals is what compute reads from the ledger.
type Totals struct {
	Entries int   `json:"entries"`
	Total   int64 `json:"total"`
}

func main() {
	next := flag.Int("next", 0, "print the next N fire times and exit")
	flag.Parse()
	if *next > 0 {
		if err := printNext(os.Stdout, time.Now(), *next); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), os.Getenv("DATABASE_URL"), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "settlement:", err)
		os.Exit(1)
	}
}

// printNext prints the next n fire times after from, computed by the
// library exactly as the scheduler will compute them.
func printNext(w io.Writer, from time.Time, n int) error {
	loc, err := time.LoadLocation(timeZone)
	if err != nil {
		return err
	}
	s, err := scheduler.ParseSpec(spec, loc)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%q in %s, after %s:\n", spec, timeZone, from.In(loc).Format("2006-01-02 15:04 MST"))
	for i := 0; i < n; i++ {
		from = s.Next(from)
		fmt.Fprintf(w, "  %s  (%s)\n", from.Format("Mon 2006-01-02 15:04 MST"), from.UTC().Format(time.RFC3339))
	}
	return nil
}

// register declares the settlement workflow. Every effect on the ledger is
// a StepTx, committed with its checkpoint; the settlement row is keyed by
// (ledger, period), so a second run of the same month writes nothing.
func register(reg *workflow.Registry, pool *pgxpool.Pool, loc *time.Location, out io.Writer) *workflow.Workflow[SettleInput, Settlement] {
	return workflow.MustRegister(reg, workflowName, func(wctx workflow.Context, in SettleInput) (Settlement, error) {
		run := wctx.RunID()
		s := Settlement{Ledger: in.Ledger, Period: in.FireTime.In(loc).Format("2006-01")}
		if in.WaitForMonthEnd {
			if err := workflow.SleepUntil(wctx, "month-end", monthEnd(in.FireTime, loc)); err != nil {
				return s, err
			}
		}

		// Lock the ledger against postings for the period being settled.
		// Another settlement holding it makes the step retry later.
		_, err := workflow.StepTx(wctx, "lock-ledger", func(ctx context.Context, tx pgx.Tx) (bool, error) {
			tag, err := tx.Exec(ctx, `UPDATE ledgers SET locked_by = $2
				WHERE ledger = $1 AND (locked_by IS NULL OR locked_by = $2)`, in.Ledger, run)
			if err != nil {
				return false, err
			}
			if tag.RowsAffected() == 0 {
				return false, core.RetryIn(time.Second, fmt.Errorf("ledger %q is locked by another run", in.Ledger))
			}
			return true, nil
		}, &workflow.StepOpts{MaxAttempts: 30})
		if err != nil {
			return s, err
		}
		// Should a later step fail for good, the ledger is unlocked again.
		workflow.Compensate(wctx, "unlock-ledger", func(ctx context.Context) error {
			_, err := pool.Exec(ctx, `UPDATE ledgers SET locked_by = NULL WHERE ledger = $1 AND locked_by = $2`, in.Ledger, run)
			return err
		})

		totals, err := workflow.Step(wctx, "compute", func(ctx context.Context) (Totals, error) {
			var t Totals
			err := pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount), 0) FROM entries
				WHERE ledger = $1 AND period = $2`, in.Ledger, s.Period).Scan(&t.Entries, &t.Total)
			return t, err
		}, nil)
		if err != nil {
			return s, err
		}
		s.Entries, s.Total = totals.Entries, totals.Total

		// The row, once per ledger and month, and the unlock, with the checkpoint.
		s.SettledBy, err = workflow.StepTx(wctx, "write-settlement", func(ctx context.Context, tx pgx.Tx) (string, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO settlements (ledger, period, run_id, entries, total)
				VALUES ($1, $2, $3, $4, $5) ON CONFLICT (ledger, period) DO NOTHING`,
				in.Ledger, s.Period, run, s.Entries, s.Total); err != nil {
				return "", err
			}
			var by string
			if err := tx.QueryRow(ctx, `SELECT run_id FROM settlements WHERE ledger = $1 AND period = $2`,
				in.Ledger, s.Period).Scan(&by); err != nil {
				return "", err
			}
			_, err := tx.Exec(ctx, `UPDATE ledgers SET locked_by = NULL WHERE ledger = $1 AND locked_by = $2`, in.Ledger, run)
			return by, err
		}, nil)
		if err != nil {
			return s, err
		}

		// At least once, so keyed by the run: a second attempt sends nothing.
		_, err = workflow.Step(wctx, "notify", func(ctx context.Context) (bool, error) {
			msg := fmt.Sprintf("ledger %s settled for %s: %d entries, total %d", s.Ledger, s.Period, s.Entries, s.Total)
			if s.SettledBy != run {
				msg = fmt.Sprintf("ledger %s for %s was already settled by run %s", s.Ledger, s.Period, s.SettledBy)
			}
			_, err := pool.Exec(ctx, `INSERT INTO notifications (run_id, message) VALUES ($1, $2)
				ON CONFLICT (run_id) DO NOTHING`, run, msg)
			return err == nil, err
		}, nil)
		return s, err
	})
}

// tables are the example's own: the ledger, its entries, the settlements
// and the notifications.
const tables = `
CREATE TABLE ledgers (ledger text PRIMARY KEY, locked_by text);
CREATE TABLE entries (ledger text, period text, amount bigint);
CREATE TABLE settlements (ledger text, period text, run_id text, entries int, total bigint,
	settled_at timestamptz DEFAULT now(), PRIMARY KEY (ledger, period));
CREATE TABLE notifications (run_id text PRIMARY KEY, message text);
INSERT INTO ledgers VALUES ('main', NULL)`

func run(ctx context.Context, url string, out io.Writer) error {
	// A schema of its own, reset at each run: the example runs again and
	// again on a shared DATABASE_URL and never counts another run's rows.
	db, err := devdb.Open(ctx, devdb.Options{URL: url, Schema: "relay_example_settlement", Out: out})
	if err != nil {
		return err
	}
	defer db.Close()
	pool := db.Pool
	loc, err := time.LoadLocation(timeZone)
	if err != nil {
		return err
	}
	period := time.Now().In(loc).Format("2006-01")
	if _, err := pool.Exec(ctx, tables); err != nil {
		return fmt.Errorf("create the example's tables: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO entries SELECT 'main', $1, a FROM unnest(ARRAY[1200, -300, 4500]) a`, period); err != nil {
		return fmt.Errorf("post entries: %w", err)
	}

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := workflow.NewRegistry(pool, &workflow.Config{Logger: quiet})
	defer reg.Close()
	register(reg, pool, loc, out)

	// The schedule's job is the workflow start hook: at each fire it starts
	// one run of "settlement", its id and input's fire_time from the fire.
	sched, err := scheduler.New(pool, &scheduler.Config{
		Schedules: []scheduler.Schedule{{
			Name:     scheduleName,
			Spec:     spec,
			TimeZone: timeZone,
			Args: workflow.StartArgs{
				Workflow:    workflowName,
				Input:       json.RawMessage(`{"ledger": "main"}`),
				Queue:       "finance",
				FireTimeKey: "fire_time",
			},
			Opts:    &core.EnqueueOpts{Queue: "finance", MaxAttempts: 10},
			CatchUp: scheduler.CatchUpLatest, // a missed month-end still settles, once
			Overlap: scheduler.OverlapSkip,   // never two settlements at once
		}},
		Logger: quiet,
	})
	if err != nil {
		return err
	}
	if err := sched.Start(ctx); err != nil {
		return err
	}
	defer sched.Stop(context.Background()) //nolint:errcheck

	workers := core.NewWorkers()
	if err := reg.AddWorkers(workers); err != nil {
		return err
	}
	client, err := core.NewClient(pool, &core.Config{
		Workers: workers, Queues: map[string]core.QueueConfig{"finance": {MaxWorkers: 2}},
		PollInterval: 100 * time.Millisecond, Logger: quiet,
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer client.Stop(context.Background()) //nolint:errcheck

	list, err := scheduler.List(ctx, pool)
	if err != nil {
		return err
	}
	for _, s := range list {
		fmt.Fprintf(out, "schedule %s (%s, %s): next fire %s\n", s.Name, s.Spec, s.TimeZone, s.NextFireAt.Format(time.RFC3339))
	}

	// Month-end is far away; trigger the schedule by hand, twice, as an
	// operator re-running a settlement would. Each trigger is a fire of its
	// own, so a run of its own; the second finds the month settled.
	fmt.Fprintln(out, "triggering the settlement twice:")
	var first *core.JobRow
	for i := range 2 {
		res, err := scheduler.TriggerNow(ctx, pool, scheduleName)
		if err != nil {
			return err
		}
		j, err := settle(ctx, pool, res.ID, out)
		if err != nil {
			return err
		}
		if i == 0 {
			first = j
		}
	}

	// The same fire started twice (a duplicate delivery of its job): the
	// run id is derived from the fire time, so it is the same run.
	fmt.Fprintln(out, "starting the first fire again:")
	var args workflow.StartArgs
	if err := json.Unmarshal(first.EncodedArgs, &args); err != nil {
		return fmt.Errorf("decode the fire's args: %w", err)
	}
	var meta map[string]any
	if err := json.Unmarshal(first.Metadata, &meta); err != nil {
		return fmt.Errorf("decode the fire's metadata: %w", err)
	}
	res, err := core.Enqueue(ctx, pool, args, &core.EnqueueOpts{Queue: "finance", Metadata: meta})
	if err != nil {
		return err
	}
	if j, err := settle(ctx, pool, res.ID, out); err != nil {
		return err
	} else if j.Attempt != 1 {
		return fmt.Errorf("start job %d took %d attempts", j.ID, j.Attempt)
	}
	fmt.Fprintln(out, "  the first fire's run, not a new one: its steps ran once")

	var settlements, runs, notes int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM settlements),
		(SELECT count(*) FROM relay_workflow_runs WHERE workflow = $1),
		(SELECT count(*) FROM notifications)`, workflowName).Scan(&settlements, &runs, &notes); err != nil {
		return err
	}
	fmt.Fprintf(out, "settlements recorded: %d (3 starts, %d runs, %d notifications, one effect)\n", settlements, runs, notes)
	return nil
}

// settle waits for a start job, then for the run it started, and prints the
// run's outcome and step timeline. It returns the start job.
func settle(ctx context.Context, pool *pgxpool.Pool, jobID int64, out io.Writer) (*core.JobRow, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var j *core.JobRow
	for {
		var err error
		if j, err = core.JobGet(ctx, pool, jobID); err != nil {
			return nil, err
		}
		if j.State.Final() {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("start job %d not done: %w", jobID, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if j.State != core.StateSucceeded {
		return nil, fmt.Errorf("start job %d ended %s", jobID, j.State)
	}
	var meta map[string]any
	if err := json.Unmarshal(j.Metadata, &meta); err != nil {
		return nil, fmt.Errorf("start job %d metadata: %w", jobID, err)
	}
	// The id the start hook gives a fire's run (StartArgs.FireTimeKey).
	id := fmt.Sprintf("%s:%s:%s", workflowName, meta[scheduler.MetaSchedule], meta[scheduler.MetaFireTime])
	fmt.Fprintf(out, "  start job %d -> run %s\n", jobID, id)
	s, err := workflow.Result[Settlement](ctx, pool, id)
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", id, err)
	}
	if s.SettledBy == id {
		fmt.Fprintf(out, "  settled ledger %s for %s: %d entries, total %d\n", s.Ledger, s.Period, s.Entries, s.Total)
	} else {
		fmt.Fprintf(out, "  ledger %s for %s was already settled by run %s; nothing written\n", s.Ledger, s.Period, s.SettledBy)
	}
	run, err := workflow.Get(ctx, pool, id)
	if err != nil {
		return nil, err
	}
	if run.State != workflow.StateCompleted {
		return nil, errors.New("run " + id + " is " + string(run.State))
	}
	fmt.Fprintf(out, "  run %s, steps:", run.State)
	for _, s := range run.Steps {
		fmt.Fprintf(out, " %s(%s)", s.Key, s.State)
	}
	fmt.Fprintln(out)
	return j, nil
}
