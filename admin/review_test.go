package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/testdb"
	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/scheduler"
)

// TestRowLockedByAnotherTransaction: a job row held by another transaction
// (a worker finishing it, a user's transaction around CompleteTx) makes a
// one-job change a 409 after the lock timeout — not a request hanging until
// its deadline and ending in a 500 — and a bulk operation skips that job
// and changes the others. Nothing is changed or audited for the locked job.
func TestRowLockedByAnotherTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h, err := Handler(b.pool, &Config{Auth: &Auth{Issuer: testIssuer, Audience: testAudience, HS256Secret: testSecret},
		LockTimeout: 100 * time.Millisecond, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b.h = h
	locked := b.job("receipt.send", "mail", core.StateDead, "boom")
	free := b.job("receipt.send", "mail", core.StateDead, "boom")
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // test cleanup
	if _, err := tx.Exec(b.ctx, `SELECT 1 FROM relay_jobs WHERE id = $1 FOR UPDATE`, locked); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/jobs/" + itoa(locked) + "/requeue", "/v1/jobs/" + itoa(locked) + "/cancel"} {
		b.problem(b.do("POST", path, b.rw, nil), 409)
	}
	if n := b.count(`SELECT count(*) FROM relay_admin_audit`); n != 0 {
		t.Fatalf("%d audit rows for refused changes", n)
	}
	res := b.ok(b.do("POST", "/v1/jobs/bulk", b.rw, map[string]any{"action": "requeue", "filter": map[string]any{"queue": "mail"}}))
	if res["matched"].(float64) != 2 || res["changed"].(float64) != 1 || res["skipped"].(float64) != 1 {
		t.Fatalf("bulk requeue beside a locked job: %v", res)
	}
	if b.state(free) != "queued" || b.state(locked) != "dead" {
		t.Fatalf("free job %s, locked job %s", b.state(free), b.state(locked))
	}
	// The finished jobs a bulk delete meets locked are skipped too.
	if _, err := tx.Exec(b.ctx, `SELECT 1 FROM relay_jobs WHERE id = $1 FOR UPDATE`, locked); err != nil {
		t.Fatal(err)
	}
	other := b.job("receipt.send", "mail", core.StateSucceeded, "")
	res = b.ok(b.do("POST", "/v1/jobs/bulk", b.rw, map[string]any{"action": "delete", "filter": map[string]any{"queue": "mail"}}))
	if res["changed"].(float64) != 1 || res["skipped"].(float64) != 1 {
		t.Fatalf("bulk delete beside a locked job: %v", res)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs WHERE id = $1`, other); n != 0 {
		t.Fatal("the unlocked finished job was not deleted")
	}
	b.problem(b.do("DELETE", "/v1/jobs/"+itoa(locked), b.rw, nil), 409)
}

// TestEveryRouteChecksItsScope walks the OpenAPI document: every GET
// declares and needs relay:read (a write-only token is refused), every other
// method declares and needs relay:write (a read-only token is refused), and
// nothing changes in the database or the audit log.
func TestEveryRouteChecksItsScope(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wo := b.token(TokenOpts{Subject: "writer", Scopes: []string{ScopeWrite}})
	b.job("receipt.send", "mail", core.StateDead, "boom")
	var doc struct {
		Paths map[string]map[string]struct {
			Security []map[string][]string `json:"security"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(b.do("GET", "/openapi.json", "", nil).Body, &doc); err != nil {
		t.Fatal(err)
	}
	writes := 0
	for path, methods := range doc.Paths {
		for method, o := range methods {
			method = strings.ToUpper(method)
			want, wrong := ScopeWrite, b.ro
			if method == http.MethodGet {
				want, wrong = ScopeRead, wo
			} else {
				writes++
			}
			if len(o.Security) != 1 || !slices.Equal(o.Security[0]["bearer"], []string{want}) {
				t.Errorf("%s %s declares %v, want bearer %s", method, path, o.Security, want)
			}
			concrete := strings.NewReplacer("{id}", "1", "{name}", "x").Replace(path)
			if strings.HasPrefix(path, "/v1/idempotency-keys") {
				concrete += "?scope=s&key=k"
			}
			p := b.problem(b.do(method, concrete, wrong, nil), http.StatusForbidden)
			if !strings.Contains(p["detail"].(string), want) {
				t.Errorf("%s %s: 403 does not name %s: %v", method, path, want, p)
			}
		}
	}
	if writes < 10 {
		t.Fatalf("only %d write operations in the document", writes)
	}
	if n := b.count(`SELECT count(*) FROM relay_admin_audit`); n != 0 {
		t.Fatalf("%d audit rows after refused writes", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs WHERE state = 'dead'`); n != 1 {
		t.Fatal("a refused write changed the dead job")
	}
}

// TestTokenClaimsTheDatabaseCannotStore: a validly signed token whose sub
// the audit log cannot store (a NUL byte, longer than 200
// bytes) is refused with 401, not a 500 on its first write; and a token
// larger than 8 KiB is refused before it is parsed.
func TestTokenClaimsTheDatabaseCannotStore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, sub := range []string{"a\x00b", strings.Repeat("s", 201)} {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"iss": testIssuer, "aud": testAudience, "sub": sub,
			"scope": "relay:read relay:write", "exp": time.Now().Add(time.Hour).Unix()}).SignedString(testSecret)
		if err != nil {
			t.Fatal(err)
		}
		b.problem(b.do("POST", "/v1/queues/q/pause", tok, nil), http.StatusUnauthorized)
	}
	big := b.token(TokenOpts{Scopes: []string{ScopeRead, ScopeWrite, strings.Repeat("x", 8<<10)}})
	b.problem(b.do("GET", "/v1/audit", big, nil), http.StatusUnauthorized)
	if n := b.count(`SELECT count(*) FROM relay_queue_pauses`); n != 0 {
		t.Fatal("a refused token paused a queue")
	}
}

// TestStoredSubscriptionsAndBrokenSchedules: /v1/outbox/subscriptions lists
// the subscriptions the dispatchers stored (any process's, with their
// namespace and whether retired), not only those the serving process was
// configured with; a schedule no process can evaluate shows why, and since
// when.
func TestStoredSubscriptionsAndBrokenSchedules(t *testing.T) {
	t.Parallel()
	b := setup(t) // configured without Subscriptions, as relay serve is
	d, err := outbox.NewDispatcher(b.pool, &outbox.Config{Namespace: "billing", Subscriptions: []outbox.Subscription{
		{Topic: "invoice.paid", Kind: "ledger.post", Opts: &core.EnqueueOpts{Queue: "ledger", MaxAttempts: 7}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Declare(b.ctx); err != nil {
		t.Fatal(err)
	}
	subs := b.ok(b.do("GET", "/v1/outbox/subscriptions", b.ro, nil))["items"].([]any)
	if len(subs) != 1 {
		t.Fatalf("subscriptions: %s", mustJSON(subs))
	}
	s0 := subs[0].(map[string]any)
	if s0["topic"] != "invoice.paid" || s0["kind"] != "ledger.post" || s0["queue"] != "ledger" || s0["namespace"] != "billing" ||
		s0["max_attempts"].(float64) != 7 || s0["retired"] != false {
		t.Fatalf("subscription: %s", mustJSON(s0))
	}

	sch, err := scheduler.New(b.pool, &scheduler.Config{Schedules: []scheduler.Schedule{
		{Name: "nightly", Spec: "0 3 * * *", Args: tickArgs{}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Declare(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.exec(`UPDATE relay_schedules SET timezone = 'Mars/Olympus', broken_error = 'unknown time zone Mars/Olympus', broken_at = now() WHERE name = 'nightly'`)
	got := b.ok(b.do("GET", "/v1/schedules/nightly", b.ro, nil))
	if got["broken_error"] != "unknown time zone Mars/Olympus" || got["broken_at"] == nil || got["broken"] != true {
		t.Fatalf("broken schedule: %s", mustJSON(got))
	}
}

// TestReadyzDoesNotLeakTheConnection: /readyz needs no token, so when the
// database is unreachable its body says so without the connection's user,
// database name or host (the server log has them).
func TestReadyzDoesNotLeakTheConnection(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://secretuser@127.0.0.1:1/secretdb?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rec := httptest.NewRecorder()
	Readyz(pool).ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "database unreachable") {
		t.Fatalf("unreachable database: %d %s", rec.Code, rec.Body)
	}
	for _, secret := range []string{"secretuser", "secretdb", "127.0.0.1"} {
		if strings.Contains(rec.Body.String(), secret) {
			t.Errorf("/readyz body names %q: %s", secret, rec.Body)
		}
	}
}

// TestScheduleChangesNeedOneConnection: a schedule change (made through the
// scheduler package, on the pool) does not hold a second connection open
// for its audit row meanwhile, so it works on a pool of one connection — and
// concurrent changes cannot starve each other (or a service's workers on a
// shared pool) of connections.
func TestScheduleChangesNeedOneConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.pool.Config()
	cfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	h, err := Handler(one, &Config{Auth: &Auth{Issuer: testIssuer, Audience: testAudience, HS256Secret: testSecret},
		RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b.h = h
	sch, err := scheduler.New(b.pool, &scheduler.Config{Schedules: []scheduler.Schedule{{Name: "nightly", Spec: "0 3 * * *", Args: tickArgs{}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Declare(b.ctx); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"pause", "resume", "trigger"} {
		b.ok(b.do("POST", "/v1/schedules/nightly/"+a, b.rw, nil))
	}
	if n := b.count(`SELECT count(*) FROM relay_admin_audit WHERE action LIKE 'schedules.%' AND subject = $1`, b.subject); n != 3 {
		t.Fatalf("%d schedule audit rows, want 3", n)
	}
	b.problem(b.do("POST", "/v1/schedules/nope/pause", b.rw, nil), 404)
	if n := b.count(`SELECT count(*) FROM relay_admin_audit`); n != 3 {
		t.Fatalf("a refused schedule change was audited (%d rows)", n)
	}
}

// TestBodyOnAnOperationWithoutOne: an operation that takes no body refuses
// one rather than ignoring it — `curl -X POST …/requeue -d
// '{"dry_run":true}'` must not requeue for real.
func TestBodyOnAnOperationWithoutOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dead := b.job("receipt.send", "mail", core.StateDead, "boom")
	b.problem(b.do("POST", "/v1/jobs/"+itoa(dead)+"/requeue", b.rw, `{"dry_run":true}`), http.StatusBadRequest)
	b.problem(b.do("DELETE", "/v1/jobs/"+itoa(dead), b.rw, `{"dry_run":true}`), http.StatusBadRequest)
	if s := b.state(dead); s != "dead" {
		t.Fatalf("job is %s after a refused requeue", s)
	}
	if n := b.count(`SELECT count(*) FROM relay_admin_audit`); n != 0 {
		t.Fatalf("%d audit rows", n)
	}
	// An empty body is no body.
	b.ok(b.do("POST", "/v1/jobs/"+itoa(dead)+"/requeue", b.rw, ""))
}

// TestNoAuthRefusesBrowsersFromElsewhere: a handler without authentication
// is reachable by any web page its operator's browser opens. A page from
// another origin must not change anything (a cross-site form POST to
// …/pause needs no preflight), and a page that rebinds its own DNS name to
// 127.0.0.1 must not read anything (its requests carry its own Host).
// curl on the machine itself still works.
func TestNoAuthRefusesBrowsersFromElsewhere(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	h, err := Handler(pool, &Config{NoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	send := func(method, target, host string, header map[string]string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, nil)
		req.Host = host
		for k, v := range header {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, c := range []struct {
		name         string
		method, host string
		header       map[string]string
		want         int
	}{
		{"cross-site form post", "POST", "127.0.0.1:8080", map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, 403},
		{"cross-origin post from an old browser", "POST", "127.0.0.1:8080", map[string]string{"Origin": "https://evil.example"}, 403},
		{"DNS rebinding read", "GET", "evil.example:8080", nil, 403},
		{"DNS rebinding write", "POST", "evil.example:8080", map[string]string{"Sec-Fetch-Site": "same-origin"}, 403},
		{"curl", "POST", "127.0.0.1:8080", nil, 200},
		{"curl via localhost", "GET", "localhost:8080", nil, 200},
		{"curl over IPv6", "GET", "[::1]:8080", nil, 200},
		{"same-origin page (the dashboard)", "POST", "127.0.0.1:8080", map[string]string{"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"}, 200},
	} {
		target := "/v1/queues/default/pause"
		if c.method == "GET" {
			target = "/v1/jobs"
		}
		rec := send(c.method, target, c.host, c.header)
		if rec.Code != c.want {
			t.Errorf("%s: %d, want %d: %s", c.name, rec.Code, c.want, rec.Body)
		}
		if c.want == 403 && rec.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: not a problem body", c.name)
		}
		if c.want == 403 {
			if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_queue_pauses`); n != 0 {
				t.Fatalf("%s paused the queue", c.name)
			}
		}
	}
}

// TestDryRunCountsWhatTheRunChanges: for every action, a dry run's matched
// equals the real run's, with filters and a max smaller than the matches,
// and the real run changes exactly those jobs.
func TestDryRunCountsWhatTheRunChanges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h, err := Handler(b.pool, &Config{Auth: &Auth{Issuer: testIssuer, Audience: testAudience, HS256Secret: testSecret}, BulkBatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	b.h = h
	for range 3 {
		b.job("a", "q1", core.StateDead, "e")
		b.job("a", "q1", core.StateCancelled, "")
		b.job("a", "q1", core.StateSucceeded, "")
		b.job("a", "q1", core.StateQueued, "")
		b.job("b", "q1", core.StateDead, "e")
		b.job("a", "q2", core.StateDead, "e")
	}
	for _, c := range []struct {
		action string
		filter map[string]any
		max    int
		want   int
	}{
		{"requeue", map[string]any{"queue": "q1", "kind": "a"}, 0, 6},
		{"cancel", map[string]any{"queue": "q1"}, 5, 5},
		{"delete", map[string]any{"state": "succeeded"}, 0, 3},
		{"requeue", map[string]any{"queue": "q2", "state": "dead"}, 0, 3},
	} {
		body := map[string]any{"action": c.action, "filter": c.filter, "dry_run": true}
		if c.max > 0 {
			body["max"] = c.max
		}
		dry := b.ok(b.do("POST", "/v1/jobs/bulk", b.rw, body))
		body["dry_run"] = false
		real := b.ok(b.do("POST", "/v1/jobs/bulk", b.rw, body))
		if dry["matched"] != real["matched"] || real["matched"].(float64) != float64(c.want) || real["changed"] != real["matched"] {
			t.Errorf("%s %v: dry %v, real %v, want %d", c.action, c.filter, dry, real, c.want)
		}
	}
}

// TestTraceIDIsHex: a job's traceparent comes from whoever enqueued it; only
// a W3C trace id (32 lowercase hex digits, not all zero) becomes trace_id
// and a trace_url — never markup a UI would put in a link.
func TestTraceIDIsHex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for tp, want := range map[string]string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": "4bf92f3577b34da6a3ce929d0e0e4736",
		`00-"><img src=x onerror=alert(1)>ab-00f067aa0ba902b7-01`: "",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": "",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01": "",
	} {
		id := b.job("k", "q", core.StateDead, "e")
		b.exec(`UPDATE relay_jobs SET metadata = jsonb_build_object('traceparent', $2::text) WHERE id = $1`, id, tp)
		got := b.ok(b.do("GET", "/v1/jobs/"+itoa(id), b.ro, nil))
		tid, _ := got["trace_id"].(string)
		turl, _ := got["trace_url"].(string)
		if tid != want || (want == "") != (turl == "") {
			t.Errorf("traceparent %q: trace_id %q, trace_url %q; want trace_id %q", tp, tid, turl, want)
		}
	}
}

// TestBulkDeleteRechecksTheFilterState: a bulk delete of dead jobs deletes
// only jobs still dead when their batch runs — not one requeued and
// succeeded since it was picked (succeeded is a finished state too).
func TestBulkDeleteRechecksTheFilterState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	moved := b.job("k", "q", core.StateSucceeded, "") // picked as dead, succeeded since
	dead := b.job("k", "q", core.StateDead, "e")
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // test cleanup
	n, err := bulkBatch(b.ctx, tx, "delete", []string{"dead"}, []int64{moved, dead})
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("deleted %d, want 1 (the job still dead)", n)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if b.count(`SELECT count(*) FROM relay_jobs WHERE id = $1`, moved) != 1 {
		t.Fatal("the succeeded job was deleted by a delete of dead jobs")
	}
}

// TestTokenTimes: a token without exp, or not valid yet (nbf or iat past
// the leeway in the future), is refused; one a few seconds ahead of our
// clock (within the leeway) is accepted.
func TestTokenTimes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	for _, c := range []struct {
		name string
		edit func(jwt.MapClaims)
		want int
	}{
		{"no exp", func(c jwt.MapClaims) { delete(c, "exp") }, 401},
		{"nbf in an hour", func(c jwt.MapClaims) { c["nbf"] = now.Add(time.Hour).Unix() }, 401},
		{"iat in an hour", func(c jwt.MapClaims) { c["iat"] = now.Add(time.Hour).Unix() }, 401},
		{"exp a minute ago", func(c jwt.MapClaims) { c["exp"] = now.Add(-time.Minute).Unix() }, 401},
		{"iat 5s ahead (clock skew)", func(c jwt.MapClaims) { c["iat"] = now.Add(5 * time.Second).Unix() }, 200},
		{"exp as a string", func(c jwt.MapClaims) { c["exp"] = "never" }, 401},
	} {
		claims := jwt.MapClaims{"iss": testIssuer, "aud": testAudience, "sub": "x", "scope": ScopeRead, "exp": now.Add(time.Hour).Unix()}
		c.edit(claims)
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(testSecret)
		if err != nil {
			t.Fatal(err)
		}
		if r := b.do("GET", "/v1/whoami", tok, nil); r.Status != c.want {
			t.Errorf("%s: %d, want %d: %s", c.name, r.Status, c.want, r.Body)
		}
	}
}

// TestBulkRequeueRechecksTheFilterState: a bulk requeue of cancelled jobs
// leaves a job that has died since it was picked (dead is requeueable too,
// but not what was asked); a bulk cancel of queued jobs leaves one a worker
// has claimed since.
func TestBulkRequeueRechecksTheFilterState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dead := b.job("k", "q", core.StateDead, "e")          // picked as cancelled, died since
	cancelled := b.job("k", "q", core.StateCancelled, "") // still cancelled
	claimed := b.job("k", "q", core.StateClaimed, "")     // picked as queued, claimed since
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // test cleanup
	if n, err := bulkBatch(b.ctx, tx, "requeue", []string{"cancelled"}, []int64{dead, cancelled}); err != nil || n != 1 {
		t.Fatalf("requeue of cancelled jobs: %d changed, %v; want 1", n, err)
	}
	if n, err := bulkBatch(b.ctx, tx, "cancel", []string{"queued"}, []int64{claimed}); err != nil || n != 0 {
		t.Fatalf("cancel of queued jobs: %d changed, %v; want 0", n, err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if b.state(dead) != "dead" || b.state(cancelled) != "queued" || b.state(claimed) != "claimed" {
		t.Fatalf("dead job %s, cancelled job %s, claimed job %s", b.state(dead), b.state(cancelled), b.state(claimed))
	}
}
