package scheduler_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/scheduler"
	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type reportArgs struct {
	Region string `json:"region"`
}

func (reportArgs) Kind() string { return "report" }

func start(t *testing.T, pool *pgxpool.Pool, cfg *scheduler.Config) *scheduler.Scheduler {
	t.Helper()
	s, err := scheduler.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(t, s) })
	return s
}

func stop(t *testing.T, s *scheduler.Scheduler) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Error(err)
	}
}

func TestBrokenSpecIsAnErrorAtDeclaration(t *testing.T) {
	_, err := scheduler.New(&pgxpool.Pool{}, &scheduler.Config{Schedules: []scheduler.Schedule{
		{Name: "settlement", Spec: "0 25 L * *", Args: reportArgs{}},
		{Name: "digest", Spec: "0 9 * * *", TimeZone: "Europe/Atlantis", Args: reportArgs{}},
		{Name: "ok", Spec: "0 9 * * *", Args: reportArgs{}, Opts: &core.EnqueueOpts{Delay: time.Second}},
	}})
	if err == nil {
		t.Fatal("want an error")
	}
	for _, want := range []string{
		`schedule "settlement"`, `hour field "25"`,
		`schedule "digest"`, `time zone "Europe/Atlantis"`,
		`schedule "ok"`, `Opts.RunAt and Opts.Delay must be unset`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// Several schedulers over one database, racing for the same schedule: every
// fire time gets exactly one job, and each job says which schedule and fire
// made it. (The same across OS processes with kill -9: relay prove
// scheduler, run by cmd/relay's tests.)
func TestOneJobPerFireAcrossSchedulers(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	cfg := &scheduler.Config{
		Schedules:    []scheduler.Schedule{{Name: "tick", Spec: "@every 1s", Args: reportArgs{Region: "eu"}}},
		PollInterval: 50 * time.Millisecond,
	}
	var scheds []*scheduler.Scheduler
	var pools []*pgxpool.Pool
	for range 4 {
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		pools = append(pools, pool)
		scheds = append(scheds, start(t, pool, cfg))
	}
	pool := pools[0]
	waitFor(t, "5 fires", func() bool { return count(t, pool, `SELECT count(*) FROM relay_schedule_fires`) >= 5 })
	var wg sync.WaitGroup
	for _, s := range scheds {
		wg.Add(1)
		go func() { defer wg.Done(); stop(t, s) }()
	}
	wg.Wait()

	jobs := count(t, pool, `SELECT count(*) FROM relay_jobs`)
	distinct := count(t, pool, `SELECT count(DISTINCT metadata->>'relay.fire_time') FROM relay_jobs`)
	fires := count(t, pool, `SELECT count(*) FROM relay_schedule_fires WHERE outcome = 'enqueued'`)
	if jobs != distinct || jobs != fires {
		t.Fatalf("jobs=%d distinct fire times=%d fires recorded=%d; want all equal", jobs, distinct, fires)
	}
	// Fire times are consecutive seconds: none skipped.
	gaps := count(t, pool, `
		SELECT count(*) FROM (
			SELECT fire_time - lag(fire_time) OVER (ORDER BY fire_time) AS gap FROM relay_schedule_fires) g
		WHERE gap <> interval '1 second'`)
	if gaps != 0 {
		t.Errorf("%d fire times are not one second after the previous", gaps)
	}
	var kind, args, sched string
	if err := pool.QueryRow(context.Background(),
		`SELECT kind, args::text, metadata->>'relay.schedule' FROM relay_jobs LIMIT 1`).Scan(&kind, &args, &sched); err != nil {
		t.Fatal(err)
	}
	if kind != "report" || args != `{"region": "eu"}` || sched != "tick" {
		t.Errorf("job kind=%s args=%s schedule=%s", kind, args, sched)
	}
	if n := count(t, pool, `
		SELECT count(*) FROM relay_jobs j JOIN relay_schedule_fires f
		ON f.job_id = j.id AND f.fire_time = (j.metadata->>'relay.fire_time')::timestamptz`); n != jobs {
		t.Errorf("%d of %d jobs match their fire record", n, jobs)
	}
}

func TestDeclareUpdatesAndDisables(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	daily := scheduler.Schedule{Name: "daily", Spec: "0 3 * * *", TimeZone: "Europe/Paris", Args: reportArgs{}}
	weekly := scheduler.Schedule{Name: "weekly", Spec: "@weekly", Args: reportArgs{}, Overlap: scheduler.OverlapSkip}
	stop(t, start(t, pool, &scheduler.Config{Schedules: []scheduler.Schedule{daily, weekly}}))

	list, err := scheduler.List(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "daily" || list[0].TimeZone != "Europe/Paris" || list[1].Overlap != "skip" {
		t.Fatalf("list %+v", list)
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	if at := list[0].NextFireAt.In(paris); at.Hour() != 3 || at.Minute() != 0 {
		t.Errorf("daily next fire %s, want 03:00 Paris time", at)
	}
	if err := scheduler.Pause(ctx, pool, "daily"); err != nil {
		t.Fatal(err)
	}

	// A new deploy: daily moves to 04:00, weekly is gone.
	daily.Spec = "0 4 * * *"
	stop(t, start(t, pool, &scheduler.Config{Schedules: []scheduler.Schedule{daily}}))
	list, err = scheduler.List(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if at := list[0].NextFireAt.In(paris); at.Hour() != 4 || !list[0].Paused {
		t.Errorf("daily after redeclare: next %s paused %v; want 04:00 and still paused", at, list[0].Paused)
	}
	if list[1].DisabledAt == nil {
		t.Errorf("weekly was removed from code but is not disabled")
	}
	if err := scheduler.Pause(ctx, pool, "nope"); err == nil || !strings.Contains(err.Error(), "no such schedule") {
		t.Errorf("pause of an unknown schedule: %v", err)
	}
}

// Downtime is simulated by moving a schedule's next fire five hours back,
// as if every process had been down since then.
func TestCatchUpPolicies(t *testing.T) {
	cases := []struct {
		policy scheduler.CatchUp
		limit  int
		want   int // jobs; the latest `want` of the six hourly fires
	}{
		{scheduler.CatchUpLatest, 0, 1},
		{scheduler.CatchUpSkip, 0, 0},
		{scheduler.CatchUpAll, 3, 3},
		{scheduler.CatchUpAll, 0, 6},
	}
	for _, c := range cases {
		t.Run(c.policy.String()+"/"+string(rune('0'+c.limit)), func(t *testing.T) {
			t.Parallel()
			pool := testdb.New(t)
			cfg := &scheduler.Config{
				Schedules: []scheduler.Schedule{{
					Name: "hourly", Spec: "0 * * * *", Args: reportArgs{}, CatchUp: c.policy, CatchUpLimit: c.limit,
				}},
				MisfireGrace: time.Millisecond, // every one of the six fires counts as missed
				PollInterval: 20 * time.Millisecond,
			}
			stop(t, start(t, pool, cfg)) // declares; nothing is due yet
			var hour time.Time
			if err := pool.QueryRow(context.Background(), `
				UPDATE relay_schedules SET next_fire_at = date_trunc('hour', now()) - interval '5 hours'
				RETURNING date_trunc('hour', now())`).Scan(&hour); err != nil {
				t.Fatal(err)
			}
			s := start(t, pool, cfg)
			waitFor(t, "the schedule to catch up", func() bool {
				return count(t, pool, `SELECT count(*) FROM relay_schedules WHERE next_fire_at > now()`) == 1
			})
			stop(t, s)

			rows, err := pool.Query(context.Background(),
				`SELECT (metadata->>'relay.fire_time')::timestamptz FROM relay_jobs ORDER BY 1`)
			if err != nil {
				t.Fatal(err)
			}
			var got []time.Time
			for rows.Next() {
				var ft time.Time
				if err := rows.Scan(&ft); err != nil {
					t.Fatal(err)
				}
				got = append(got, ft)
			}
			if len(got) != c.want {
				t.Fatalf("%d jobs (%v), want %d", len(got), got, c.want)
			}
			for i, ft := range got {
				want := hour.Add(time.Duration(i-c.want+1) * time.Hour)
				if !ft.Equal(want) {
					t.Errorf("job %d fire time %s, want %s", i, ft, want)
				}
			}
		})
	}
}

func TestOverlapSkip(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	start(t, pool, &scheduler.Config{
		Schedules: []scheduler.Schedule{{
			Name: "sync", Spec: "@every 1s", Args: reportArgs{}, Overlap: scheduler.OverlapSkip,
		}},
		PollInterval: 20 * time.Millisecond,
	})
	// No worker runs, so the first job stays queued and later fires skip.
	waitFor(t, "two skipped fires", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_schedule_fires WHERE outcome = 'skipped_overlap'`) >= 2
	})
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs`); n != 1 {
		t.Fatalf("%d jobs while the first was still queued, want 1", n)
	}
	var first int64
	if err := pool.QueryRow(ctx, `SELECT id FROM relay_jobs`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	// Once it finishes (here: cancelled), the next fire enqueues again.
	if err := core.Cancel(ctx, pool, first); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a second job", func() bool { return count(t, pool, `SELECT count(*) FROM relay_jobs`) == 2 })
}

func TestPauseResumeTrigger(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	start(t, pool, &scheduler.Config{
		Schedules:    []scheduler.Schedule{{Name: "s", Spec: "@every 1s", Args: reportArgs{Region: "us"}}},
		PollInterval: 20 * time.Millisecond,
	})
	waitFor(t, "a fire", func() bool { return count(t, pool, `SELECT count(*) FROM relay_jobs`) >= 1 })
	if err := scheduler.Pause(ctx, pool, "s"); err != nil {
		t.Fatal(err)
	}
	// A tick under way when Pause committed may still fire once; after that
	// nothing fires while paused, even well past the next fire time.
	var pausedAt time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&pausedAt); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the next fire time to pass", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_schedules WHERE next_fire_at + interval '1500 ms' < now()`) == 1
	})
	before := count(t, pool, `SELECT count(*) FROM relay_jobs`)
	waitFor(t, "another second", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_schedules WHERE next_fire_at + interval '2500 ms' < now()`) == 1
	})
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs`); n != before {
		t.Fatalf("paused schedule fired: %d jobs, then %d", before, n)
	}

	res, err := scheduler.TriggerNow(ctx, pool, "s")
	if err != nil {
		t.Fatal(err)
	}
	j, err := core.JobGet(ctx, pool, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	var meta map[string]string
	if err := json.Unmarshal(j.Metadata, &meta); err != nil || meta[scheduler.MetaSchedule] != "s" {
		t.Errorf("triggered job metadata %s (%v)", j.Metadata, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_schedule_fires WHERE outcome = 'triggered' AND job_id = $1`, res.ID); n != 1 {
		t.Errorf("trigger recorded %d times", n)
	}

	if err := scheduler.Resume(ctx, pool, "s"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "fires after resume", func() bool {
		return count(t, pool, `SELECT count(*) FROM relay_schedule_fires WHERE outcome = 'enqueued' AND fire_time > $1`, pausedAt.Add(3*time.Second)) >= 1
	})
}

func waitFor(t *testing.T, what string, cond func() bool) { t.Helper(); testdb.WaitFor(t, what, cond) }

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	return testdb.Count(t, pool, sql, args...)
}

// A schedule's metadata reaches each fire's job exactly: a large integer is
// not turned into a float64 on the way.
func TestFireKeepsMetadataNumbersExact(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	s, err := scheduler.New(pool, &scheduler.Config{Schedules: []scheduler.Schedule{{
		Name: "exact", Spec: "@every 1h", Args: reportArgs{Region: "eu"},
		Opts: &core.EnqueueOpts{Metadata: map[string]any{"order_id": json.Number("1234567890123456789")}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := scheduler.TriggerNow(ctx, pool, "exact")
	if err != nil {
		t.Fatal(err)
	}
	j, err := core.JobGet(ctx, pool, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(j.Metadata), `"order_id": 1234567890123456789`) && !strings.Contains(string(j.Metadata), `"order_id":1234567890123456789`) {
		t.Fatalf("job metadata %s: the schedule's order_id changed", j.Metadata)
	}
}
