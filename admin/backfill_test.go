package admin

import (
	"strings"
	"testing"

	"github.com/relayq/relay/scheduler"
)

// TestScheduleBackfill: POST /v1/schedules/{name}/backfill fires a past
// fire time once (a second call names the first job, existing), is
// audited, refuses a time that is not a past fire time (422 naming
// body.fire_time) and a read-only token (403).
func TestScheduleBackfill(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sch, err := scheduler.New(b.pool, &scheduler.Config{Schedules: []scheduler.Schedule{
		{Name: "month-end", Spec: "0 2 L * *", TimeZone: "America/New_York", Args: tickArgs{}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Declare(b.ctx); err != nil {
		t.Fatal(err)
	}
	body := `{"fire_time":"2025-10-31T02:00:00-04:00"}`
	b.problem(b.do("POST", "/v1/schedules/month-end/backfill", b.ro, body), 403)
	first := b.ok(b.do("POST", "/v1/schedules/month-end/backfill", b.rw, body))
	if first["action"] != "backfill" || first["job_id"].(float64) <= 0 || first["existing"] != nil ||
		first["fire_time"] != "2025-10-31T06:00:00Z" || first["outcome"] != "backfilled" {
		t.Fatalf("backfill: %v", first)
	}
	again := b.ok(b.do("POST", "/v1/schedules/month-end/backfill", b.rw, `{"fire_time":"2025-10-31T06:00:00Z"}`))
	if again["existing"] != true || again["job_id"] != first["job_id"] {
		t.Fatalf("second backfill: %v, want the first's job", again)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs`); n != 1 {
		t.Fatalf("%d jobs after two backfills of one fire", n)
	}
	got := b.ok(b.do("GET", "/v1/schedules/month-end?last=5", b.ro, nil))
	if fires := got["last_fires"].([]any); len(fires) != 1 || fires[0].(map[string]any)["outcome"] != "backfilled" {
		t.Fatalf("last fires: %s", mustJSON(got["last_fires"]))
	}
	p := b.problem(b.do("POST", "/v1/schedules/month-end/backfill", b.rw, `{"fire_time":"2025-10-30T02:00:00-04:00"}`), 422)
	if !strings.Contains(string(mustJSON(p)), "body.fire_time") || !strings.Contains(p["detail"].(string), "not a fire time") {
		t.Fatalf("backfill of a non-fire time: %v", p)
	}
	b.problem(b.do("POST", "/v1/schedules/month-end/backfill", b.rw, `{"fire_time":"yesterday"}`), 422)
	b.problem(b.do("POST", "/v1/schedules/month-end/backfill", b.rw, `{}`), 422)
	b.problem(b.do("POST", "/v1/schedules/nope/backfill", b.rw, body), 404)
	if n := b.count(`SELECT count(*) FROM relay_admin_audit WHERE action = 'schedules.backfill'`); n != 2 {
		t.Errorf("%d backfills audited, want the 2 accepted", n)
	}
}
