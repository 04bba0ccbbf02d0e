package scheduler_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/scheduler"
	"github.com/relayq/relay/testkit/testdb"
)

// Backfill fires a month-end schedule for a past month once: its job
// carries that fire time (what workflow.StartArgs.FireTimeKey settles), a
// second backfill of the fire enqueues nothing and names the first job, a
// fire the overlap policy skipped is backfilled, and a time that is not a
// past fire time is refused with the fire times around it.
func TestBackfill(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	s, err := scheduler.New(pool, &scheduler.Config{Schedules: []scheduler.Schedule{{
		Name: "month-end", Spec: "0 2 L * *", TimeZone: "America/New_York", Args: reportArgs{Region: "eu"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	ny, _ := time.LoadLocation("America/New_York")
	october := time.Date(2025, 10, 31, 2, 0, 0, 0, ny)
	b, err := scheduler.Backfill(ctx, pool, "month-end", october.UTC()) // the instant counts, not its zone
	if err != nil {
		t.Fatal(err)
	}
	if b.Existing || b.JobID == 0 || b.Outcome != "backfilled" || !b.FireTime.Equal(october) {
		t.Fatalf("backfill %+v", b)
	}
	j, err := core.JobGet(ctx, pool, b.JobID)
	if err != nil {
		t.Fatal(err)
	}
	var meta map[string]any
	if err := json.Unmarshal(j.Metadata, &meta); err != nil {
		t.Fatal(err)
	}
	if meta[scheduler.MetaSchedule] != "month-end" || meta[scheduler.MetaFireTime] != "2025-10-31T06:00:00Z" {
		t.Fatalf("backfilled job's metadata %s: want the October fire", j.Metadata)
	}
	again, err := scheduler.Backfill(ctx, pool, "month-end", october)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Existing || again.JobID != b.JobID || again.Outcome != "backfilled" {
		t.Fatalf("second backfill %+v, want the first's job %d", again, b.JobID)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs`); n != 1 {
		t.Fatalf("%d jobs after two backfills of one fire", n)
	}

	// A fire skipped by the overlap policy enqueued nothing: it can be
	// backfilled.
	september := time.Date(2025, 9, 30, 2, 0, 0, 0, ny)
	if _, err := pool.Exec(ctx, `INSERT INTO relay_schedule_fires (schedule, fire_time, outcome) VALUES ('month-end', $1, 'skipped_overlap')`, september); err != nil {
		t.Fatal(err)
	}
	sb, err := scheduler.Backfill(ctx, pool, "month-end", september)
	if err != nil || sb.Existing || sb.JobID == 0 {
		t.Fatalf("backfill of a skipped fire: %+v, %v", sb, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_schedule_fires WHERE fire_time = $1 AND outcome = 'backfilled' AND job_id = $2`, september, sb.JobID); n != 1 {
		t.Fatal("the skipped fire's record is not backfilled with its job")
	}

	for _, c := range []struct {
		at   time.Time
		want string
	}{
		{time.Date(2025, 10, 30, 2, 0, 0, 0, ny), "the next one after it is 2025-10-31T02:00:00-04:00"},
		{time.Date(2025, 10, 31, 3, 0, 0, 0, ny), "is not a fire time"},
		{time.Now().AddDate(1, 0, 0), "is not before the database's now"},
	} {
		_, err := scheduler.Backfill(ctx, pool, "month-end", c.at)
		if !errors.Is(err, scheduler.ErrNotAFireTime) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("backfill %s: %v, want ErrNotAFireTime saying %q", c.at, err, c.want)
		}
	}
	if _, err := scheduler.Backfill(ctx, pool, "nope", october); !errors.Is(err, scheduler.ErrNotFound) {
		t.Errorf("backfill of an unknown schedule: %v", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM relay_jobs`); n != 2 {
		t.Errorf("%d jobs, want the two backfills'", n)
	}
}
