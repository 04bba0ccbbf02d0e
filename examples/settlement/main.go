// Command settlement is Relay's month-end example: a settlement report
// scheduled at 02:00 New York time on the last day of every month
// (`0 2 L * *`), run by a worker whose effect is idempotent.
//
//	go run ./examples/settlement -next 5   # print the next five fire times
//	go run ./examples/settlement           # declare, trigger twice, settle once
//
// It uses $DATABASE_URL, or starts a throwaway PostgreSQL when that is empty.
// On $DATABASE_URL it works in a schema of its own, relay_example_settlement,
// dropped and created afresh at each run (and left afterwards for you to
// inspect), so it runs again and again on a shared database.
package main

import (
	"context"
	"encoding/json"
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
)

// The schedule: 02:00 on the last day of each month, New York time.
const (
	spec     = "0 2 L * *"
	timeZone = "America/New_York"
)

// SettleArgs is the settlement job. It carries no period: the period is the
// month of the fire time, which the scheduler stores on the job.
type SettleArgs struct {
	Ledger string `json:"ledger"`
}

func (SettleArgs) Kind() string { return "settlement.run" }

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

// settleWorker records one settlement per ledger and month. It is safe to
// run twice: the settlement row and the job's success commit in one
// transaction (core.CompleteTx), and the row's primary key turns a second
// settlement of the same month into a no-op.
type settleWorker struct {
	pool *pgxpool.Pool
	out  io.Writer
}

func (w *settleWorker) Work(ctx context.Context, job *core.Job[SettleArgs]) error {
	var meta map[string]string
	if err := json.Unmarshal(job.Metadata, &meta); err != nil {
		return core.Permanent(fmt.Errorf("metadata: %w", err))
	}
	fired, err := time.Parse(time.RFC3339Nano, meta[scheduler.MetaFireTime])
	if err != nil {
		return core.Permanent(fmt.Errorf("no fire time on the job: %w", err))
	}
	loc, _ := time.LoadLocation(timeZone)
	period := fired.In(loc).Format("2006-01")
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `
			INSERT INTO settlements (ledger, period, job_id) VALUES ($1, $2, $3)
			ON CONFLICT (ledger, period) DO NOTHING`, job.Args.Ledger, period, job.ID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			fmt.Fprintf(w.out, "  job %d: settled ledger %s for %s\n", job.ID, job.Args.Ledger, period)
		} else {
			fmt.Fprintf(w.out, "  job %d: ledger %s for %s was already settled; nothing to do\n", job.ID, job.Args.Ledger, period)
		}
		return core.CompleteTx(ctx, tx, job)
	})
}

func run(ctx context.Context, url string, out io.Writer) error {
	// A schema of its own, reset at each run: the example runs again and
	// again on a shared DATABASE_URL and never counts another run's rows.
	db, err := devdb.Open(ctx, devdb.Options{URL: url, Schema: "relay_example_settlement", Out: out})
	if err != nil {
		return err
	}
	defer db.Close()
	pool := db.Pool
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS settlements (
		ledger text, period text, job_id bigint, settled_at timestamptz DEFAULT now(),
		PRIMARY KEY (ledger, period))`); err != nil {
		return err
	}

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sched, err := scheduler.New(pool, &scheduler.Config{
		Schedules: []scheduler.Schedule{{
			Name:     "month-end-settlement",
			Spec:     spec,
			TimeZone: timeZone,
			Args:     SettleArgs{Ledger: "main"},
			Opts:     &core.EnqueueOpts{Queue: "finance", MaxAttempts: 10},
			CatchUp:  scheduler.CatchUpLatest, // a missed month-end still settles, once
			Overlap:  scheduler.OverlapSkip,   // never two settlements at once
		}},
		Logger: quiet,
	})
	if err != nil {
		return err
	}
	if err := sched.Start(ctx); err != nil {
		return err
	}
	defer sched.Stop(context.Background())

	workers := core.NewWorkers()
	core.MustAddWorker(workers, core.Worker[SettleArgs](&settleWorker{pool: pool, out: out}))
	client, err := core.NewClient(pool, &core.Config{
		Workers: workers, Queues: map[string]core.QueueConfig{"finance": {MaxWorkers: 2}}, Logger: quiet,
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer client.Stop(context.Background())

	list, err := scheduler.List(ctx, pool)
	if err != nil {
		return err
	}
	for _, s := range list {
		fmt.Fprintf(out, "schedule %s (%s, %s): next fire %s\n", s.Name, s.Spec, s.TimeZone, s.NextFireAt.Format(time.RFC3339))
	}

	// Month-end is far away; trigger the schedule by hand, twice, as an
	// operator re-running a settlement would. Both jobs settle this month:
	// the second finds it done.
	fmt.Fprintln(out, "triggering the settlement twice:")
	var ids []int64
	for range 2 {
		res, err := scheduler.TriggerNow(ctx, pool, "month-end-settlement")
		if err != nil {
			return err
		}
		ids = append(ids, res.ID)
	}
	for _, id := range ids {
		for {
			j, err := core.JobGet(ctx, pool, id)
			if err != nil {
				return err
			}
			if j.State.Final() {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM settlements`).Scan(&n); err != nil {
		return err
	}
	fmt.Fprintf(out, "settlements recorded: %d (two runs, one effect)\n", n)
	return nil
}
