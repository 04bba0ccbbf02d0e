package admin

import (
	"strings"
	"testing"
)

// TestOddInputsNeverFail500: odd values in every place a client controls get
// a 4xx problem (or an empty result), never a 500.
func TestOddInputsNeverFail500(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.job("k", "q", "dead", "e")
	odd := []string{"%00", "a%00b", "%FF%FE", "99999999999999999999", "-1", "0", "1e3", "%27", "..%2F..%2Fetc", strings.Repeat("x", 2000), "0000-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "1970-01-01T00:00:00%2B14:00"}
	gets := []string{
		"/v1/jobs?state=", "/v1/jobs?queue=", "/v1/jobs?kind=", "/v1/jobs?ordering_key=", "/v1/jobs?limit=", "/v1/jobs?cursor=",
		"/v1/jobs?created_after=", "/v1/jobs?finalized_before=", "/v1/jobs/",
		"/v1/queues?window_minutes=", "/v1/queues/", "/v1/schedules?next=", "/v1/schedules/",
		"/v1/outbox/events?topic=", "/v1/outbox/events?cursor=", "/v1/outbox/blocked-keys?queue=", "/v1/outbox/blocked-keys?limit=",
		"/v1/idempotency-keys?scope=s&key=", "/v1/audit?subject=", "/v1/audit?cursor=",
	}
	for _, g := range gets {
		for _, v := range odd {
			r := b.do("GET", g+v, b.rw, nil)
			if r.Status >= 500 {
				t.Errorf("GET %s: %d %s", g+v, r.Status, r.Body)
			}
			if r.Status >= 400 && r.Header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("GET %s: %d without a problem body", g+v, r.Status)
			}
		}
	}
	bodies := []string{
		`{"action":"requeue","filter":{"kind":"a\u0000b"}}`,
		`{"action":"requeue","filter":{"queue":"\ud800"}}`,
		`{"action":"requeue","filter":{"created_after":"0000-01-01T00:00:00Z"}}`,
		`{"action":"requeue","filter":{},"max":0}`,
		`{"action":"requeue","filter":{},"max":1000001}`,
		`{"action":"requeue"}`,
		`[]`, `null`, `"x"`, ``, `{"action":"requeue","filter":{"state":"dead","state":"queued"}}`,
	}
	for _, body := range bodies {
		r := b.do("POST", "/v1/jobs/bulk", b.rw, body)
		if r.Status >= 500 || (r.Status >= 400 && r.Header.Get("Content-Type") != "application/problem+json") {
			t.Errorf("bulk %s: %d %s", body, r.Status, r.Body)
		}
	}
	for _, p := range []string{"/v1/queues/a%00b/pause", "/v1/schedules/a%00b/pause", "/v1/jobs/1/requeue?x=1"} {
		if r := b.do("POST", p, b.rw, nil); r.Status >= 500 {
			t.Errorf("POST %s: %d %s", p, r.Status, r.Body)
		}
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs`); n != 1 {
		t.Fatalf("%d jobs after odd inputs", n)
	}
}
