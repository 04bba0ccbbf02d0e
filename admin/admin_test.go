package admin

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

var testSecret = []byte("0123456789abcdef0123456789abcdef-test")

const (
	testIssuer   = "relay-test"
	testAudience = "relay-admin"
)

// bundle is what a test needs: a database, the handler, tokens.
type bundle struct {
	t       *testing.T
	pool    *pgxpool.Pool
	h       http.Handler
	rw, ro  string // tokens: read+write, read only
	ctx     context.Context
	subject string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := testdb.New(t)
	h, err := Handler(pool, &Config{Auth: &Auth{Issuer: testIssuer, Audience: testAudience, HS256Secret: testSecret},
		TraceURL: "http://jaeger.test/trace/{trace_id}"})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{t: t, pool: pool, h: h, ctx: context.Background(), subject: "alice@example.com"}
	b.rw = b.token(TokenOpts{})
	b.ro = b.token(TokenOpts{Subject: "reader", Scopes: []string{ScopeRead}})
	return b
}

// token mints a test token; zero fields take the test's defaults.
func (b *bundle) token(o TokenOpts) string {
	b.t.Helper()
	if o.Issuer == "" {
		o.Issuer = testIssuer
	}
	if o.Audience == "" {
		o.Audience = testAudience
	}
	if o.Subject == "" {
		o.Subject = b.subject
	}
	tok, err := MintToken(testSecret, o)
	if err != nil {
		b.t.Fatal(err)
	}
	return tok
}

// response is a decoded response.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("response is not a JSON object: %v: %s", err, r.Body)
	}
	return m
}

func (b *bundle) do(method, path, token string, body any) response {
	b.t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(v)
	case []byte:
		rd = bytes.NewReader(v)
	default:
		j, _ := json.Marshal(v)
		rd = bytes.NewReader(j)
	}
	req := httptest.NewRequest(method, path, rd)
	req.Host = "127.0.0.1:8080" // as curl on the machine would (NoAuth handlers answer loopback hosts only)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	b.h.ServeHTTP(rec, req)
	return response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
}

// problem asserts an RFC 9457 problem with the status and returns it.
func (b *bundle) problem(r response, status int) map[string]any {
	b.t.Helper()
	if r.Status != status {
		b.t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		b.t.Fatalf("content type %q, want application/problem+json: %s", ct, r.Body)
	}
	p := r.json(b.t)
	if int(p["status"].(float64)) != status || p["title"] == "" || p["type"] == nil || p["instance"] == nil {
		b.t.Fatalf("problem lacks members: %s", r.Body)
	}
	return p
}

func (b *bundle) ok(r response) map[string]any {
	b.t.Helper()
	if r.Status != http.StatusOK {
		b.t.Fatalf("status %d, want 200: %s", r.Status, r.Body)
	}
	return r.json(b.t)
}

type testArgs struct{ kind string }

func (a testArgs) Kind() string { return a.kind }

// job makes a job of kind in queue q in the given state, as a worker would
// have left it (a dead job has one failed attempt with errMsg).
func (b *bundle) job(kind, q string, state core.JobState, errMsg string) int64 {
	b.t.Helper()
	r, err := core.Enqueue(b.ctx, b.pool, testArgs{kind}, &core.EnqueueOpts{Queue: q, MaxAttempts: 1})
	if err != nil {
		b.t.Fatal(err)
	}
	if state == core.StateQueued {
		return r.ID
	}
	b.exec(`UPDATE relay_jobs SET state = 'claimed', attempt = 1, attempted_at = now(), attempted_by = 'worker-1',
		lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute' WHERE id = $1`, r.ID)
	switch state {
	case core.StateDead:
		b.exec(`UPDATE relay_jobs SET state = 'dead', lease_token = NULL, lease_expires_at = NULL, finalized_at = now(),
			last_error = $2, history = jsonb_build_array(jsonb_build_object('attempt', 1, 'started_at', attempted_at,
			'finished_at', now(), 'error', $2::text, 'worker', 'worker-1')) WHERE id = $1`, r.ID, errMsg)
	case core.StateSucceeded, core.StateCancelled:
		b.exec(`UPDATE relay_jobs SET state = $2, lease_token = NULL, lease_expires_at = NULL, finalized_at = now() WHERE id = $1`, r.ID, string(state))
	}
	return r.ID
}

func (b *bundle) exec(sql string, args ...any) {
	b.t.Helper()
	if _, err := b.pool.Exec(b.ctx, sql, args...); err != nil {
		b.t.Fatal(err)
	}
}

func (b *bundle) count(sql string, args ...any) int { return testdb.Count(b.t, b.pool, sql, args...) }

func (b *bundle) state(id int64) string {
	b.t.Helper()
	j, err := core.JobGet(b.ctx, b.pool, id)
	if err != nil {
		b.t.Fatal(err)
	}
	return string(j.State)
}

// TestRefusals: every refused request gets the right status and a problem
// body, and changes nothing: the dead job stays dead, the audit log empty.
func TestRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dead := b.job("receipt.send", "mail", core.StateDead, "smtp: 550 mailbox unavailable")
	requeue := "/v1/jobs/" + itoa(dead) + "/requeue"

	other, err := MintToken([]byte("another-secret-another-secret-another"), TokenOpts{Issuer: testIssuer, Audience: testAudience, Subject: "mallory"})
	if err != nil {
		t.Fatal(err)
	}
	none := b64(`{"alg":"none","typ":"JWT"}`) + "." + b64(`{"sub":"mallory","iss":"`+testIssuer+`","aud":"`+testAudience+`","exp":`+itoa(time.Now().Add(time.Hour).Unix())+`,"scope":"relay:read relay:write"}`) + "."
	// A valid token with its header swapped to none and its signature kept.
	parts := strings.Split(b.rw, ".")
	noneSigned := b64(`{"alg":"none","typ":"JWT"}`) + "." + parts[1] + "." + parts[2]

	cases := []struct {
		name   string
		method string
		path   string
		token  string
		body   any
		status int
	}{
		{"no token", "POST", requeue, "", nil, 401},
		{"malformed token", "POST", requeue, "not-a-jwt", nil, 401},
		{"expired token", "POST", requeue, b.token(TokenOpts{TTL: -time.Hour}), nil, 401},
		{"alg none", "POST", requeue, none, nil, 401},
		{"alg none keeping a signature", "POST", requeue, noneSigned, nil, 401},
		{"another key", "POST", requeue, other, nil, 401},
		{"wrong audience", "POST", requeue, b.token(TokenOpts{Audience: "billing"}), nil, 401},
		{"wrong issuer", "POST", requeue, b.token(TokenOpts{Issuer: "evil"}), nil, 401},
		{"read-only token on a write", "POST", requeue, b.ro, nil, 403},
		{"token without scopes on a read", "GET", "/v1/jobs", b.token(TokenOpts{Scopes: []string{}}), nil, 403},
		{"unknown route", "GET", "/v1/nope", b.rw, nil, 404},
		{"wrong method", "PUT", requeue, b.rw, nil, 405},
		{"unknown job", "POST", "/v1/jobs/999999/requeue", b.rw, nil, 404},
		{"job id not a number", "GET", "/v1/jobs/abc", b.rw, nil, 422},
		{"job id zero", "GET", "/v1/jobs/0", b.rw, nil, 422},
		{"bad state enum", "GET", "/v1/jobs?state=" + url.QueryEscape("dead' OR '1'='1"), b.rw, nil, 422},
		{"unknown query parameter", "GET", "/v1/jobs?colour=red", b.rw, nil, 422},
		{"page too large", "GET", "/v1/jobs?limit=501", b.rw, nil, 422},
		{"page size zero", "GET", "/v1/jobs?limit=0", b.rw, nil, 422},
		{"backwards time range", "GET", "/v1/jobs?created_after=2026-01-02T00:00:00Z&created_before=2026-01-01T00:00:00Z", b.rw, nil, 422},
		{"bad time", "GET", "/v1/jobs?created_after=yesterday", b.rw, nil, 422},
		{"forged cursor", "GET", "/v1/jobs?cursor=" + b64(`{"k":"audit","i":5}`), b.rw, nil, 422},
		{"garbage cursor", "GET", "/v1/jobs?cursor=%27%3B--", b.rw, nil, 422},
		{"illegal transition", "POST", "/v1/jobs/" + itoa(dead) + "/cancel", b.rw, nil, 409},
		{"bulk: unknown field", "POST", "/v1/jobs/bulk", b.rw, `{"action":"requeue","filter":{},"dryrun":false}`, 422},
		{"bulk: bad action", "POST", "/v1/jobs/bulk", b.rw, `{"action":"drop table","filter":{}}`, 422},
		{"bulk: state the action does not apply to", "POST", "/v1/jobs/bulk", b.rw, `{"action":"requeue","filter":{"state":"succeeded"}}`, 422},
		{"bulk: not JSON", "POST", "/v1/jobs/bulk", b.rw, `{"action":`, 400},
		{"bulk: oversized body", "POST", "/v1/jobs/bulk", b.rw, `{"action":"requeue","filter":{"kind":"` + strings.Repeat("x", 100<<10) + `"}}`, 413},
		{"bulk: oversized body without a token", "POST", "/v1/jobs/bulk", "", `{"action":"requeue","filter":{"kind":"` + strings.Repeat("x", 100<<10) + `"}}`, 401},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := b.do(c.method, c.path, c.token, c.body)
			b.problem(r, c.status)
			if c.status == 405 && r.Header.Get("Allow") == "" {
				t.Fatal("405 without Allow")
			}
			if c.status == 401 && r.Header.Get("WWW-Authenticate") == "" {
				t.Fatal("401 without WWW-Authenticate")
			}
		})
	}
	if s := b.state(dead); s != "dead" {
		t.Fatalf("job is %s after refused requests", s)
	}
	if n := b.count(`SELECT count(*) FROM relay_admin_audit`); n != 0 {
		t.Fatalf("%d audit rows after refused requests", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs`); n != 1 {
		t.Fatalf("%d jobs", n)
	}

	// Validation failures name the field.
	p := b.problem(b.do("GET", "/v1/jobs?limit=501", b.rw, nil), 422)
	if errs, _ := p["errors"].([]any); len(errs) == 0 || !strings.Contains(string(mustJSON(errs)), "query.limit") {
		t.Fatalf("no field error for limit: %v", p)
	}
}

// TestSQLLookingValues: filter values are data, never SQL.
func TestSQLLookingValues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.job("receipt.send", "mail", core.StateDead, "boom")
	for _, v := range []string{"' OR '1'='1", "x'; DROP TABLE relay_jobs; --", `\'; SELECT pg_sleep(10); --`, "mail' --"} {
		for _, param := range []string{"kind", "queue", "ordering_key"} {
			body := b.ok(b.do("GET", "/v1/jobs?"+param+"="+url.QueryEscape(v), b.ro, nil))
			if items := body["items"].([]any); len(items) != 0 {
				t.Fatalf("%s=%q matched %d jobs", param, v, len(items))
			}
		}
		r := b.ok(b.do("POST", "/v1/jobs/bulk", b.rw, map[string]any{"action": "requeue", "filter": map[string]any{"kind": v}}))
		if r["matched"].(float64) != 0 {
			t.Fatalf("bulk kind=%q matched %v", v, r["matched"])
		}
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs WHERE state = 'dead'`); n != 1 {
		t.Fatalf("%d dead jobs, want 1", n)
	}
}

// TestJobLifecycle: find a dead job, read its error and attempts, requeue it,
// and find the change in the audit log under the token's subject.
func TestJobLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.job("receipt.send", "mail", core.StateSucceeded, "")
	dead := b.job("receipt.send", "mail", core.StateDead, "smtp: 550 mailbox unavailable")
	b.exec(`UPDATE relay_jobs SET metadata = '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}' WHERE id = $1`, dead)

	list := b.ok(b.do("GET", "/v1/jobs?state=dead&queue=mail", b.ro, nil))
	items := list["items"].([]any)
	if len(items) != 1 || int64(items[0].(map[string]any)["id"].(float64)) != dead {
		t.Fatalf("dead jobs: %s", mustJSON(list))
	}
	got := b.ok(b.do("GET", "/v1/jobs/"+itoa(dead), b.ro, nil))
	if got["last_error"] != "smtp: 550 mailbox unavailable" || got["trace_id"] != "4bf92f3577b34da6a3ce929d0e0e4736" ||
		got["trace_url"] != "http://jaeger.test/trace/4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("job: %s", mustJSON(got))
	}
	atts := got["attempts"].([]any)
	if len(atts) != 1 || atts[0].(map[string]any)["worker"] != "worker-1" || atts[0].(map[string]any)["outcome"] != "failed" {
		t.Fatalf("attempts: %s", mustJSON(atts))
	}

	if q := b.ok(b.do("GET", "/v1/queues/mail", b.ro, nil)); q["dead"].(float64) != 1 || q["succeeded"].(float64) != 1 {
		t.Fatalf("queue: %s", mustJSON(q))
	}

	r := b.ok(b.do("POST", "/v1/jobs/"+itoa(dead)+"/requeue", b.rw, nil))
	if r["state"] != "queued" || b.state(dead) != "queued" {
		t.Fatalf("requeue: %s", mustJSON(r))
	}
	// Requeueing again is a conflict, not a second change.
	b.problem(b.do("POST", "/v1/jobs/"+itoa(dead)+"/requeue", b.rw, nil), 409)

	audit := b.ok(b.do("GET", "/v1/audit", b.ro, nil))["items"].([]any)
	if len(audit) != 1 {
		t.Fatalf("audit: %s", mustJSON(audit))
	}
	e := audit[0].(map[string]any)
	if e["subject"] != b.subject || e["action"] != "jobs.requeue" || e["rows_changed"].(float64) != 1 ||
		!strings.Contains(string(mustJSON(e["target"])), itoa(dead)) {
		t.Fatalf("audit entry: %s", mustJSON(e))
	}

	who := b.ok(b.do("GET", "/v1/whoami", b.ro, nil))
	if who["subject"] != "reader" || string(mustJSON(who["scopes"])) != `["relay:read"]` {
		t.Fatalf("whoami: %v", who)
	}

	// Retry now: a job queued for later runs now.
	later, err := core.Enqueue(b.ctx, b.pool, testArgs{"later"}, &core.EnqueueOpts{Queue: "mail", Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b.ok(b.do("POST", "/v1/jobs/"+itoa(later.ID)+"/retry-now", b.rw, nil))
	if n := b.count(`SELECT count(*) FROM relay_jobs WHERE id = $1 AND run_at <= now()`, later.ID); n != 1 {
		t.Fatal("retry-now did not make the job runnable")
	}
	b.problem(b.do("POST", "/v1/jobs/"+itoa(later.ID)+"/retry-now", b.rw, nil), 409)

	// Delete: finished only.
	b.problem(b.do("DELETE", "/v1/jobs/"+itoa(later.ID), b.rw, nil), 409)
	cancelled := b.job("x", "mail", core.StateCancelled, "")
	b.ok(b.do("DELETE", "/v1/jobs/"+itoa(cancelled), b.rw, nil))
	b.problem(b.do("GET", "/v1/jobs/"+itoa(cancelled), b.ro, nil), 404)
	if n := b.count(`SELECT count(*) FROM relay_admin_audit`); n != 3 {
		t.Fatalf("%d audit rows, want 3 (requeue, retry-now, delete)", n)
	}
}

// TestListPagination: keyset pages cover every job once, in order, by id and
// by finish time.
func TestListPagination(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var want []int64
	for range 7 {
		want = append(want, b.job("k", "q", core.StateDead, "e"))
	}
	b.job("k", "q", core.StateQueued, "")
	for _, path := range []string{"/v1/jobs?state=dead&limit=3", "/v1/jobs?kind=k&state=dead&limit=2"} {
		var seen []int64
		next := ""
		for pages := 0; ; pages++ {
			p := path
			if next != "" {
				p += "&cursor=" + next
			}
			body := b.ok(b.do("GET", p, b.ro, nil))
			for _, it := range body["items"].([]any) {
				seen = append(seen, int64(it.(map[string]any)["id"].(float64)))
			}
			n, _ := body["next_cursor"].(string)
			if n == "" {
				break
			}
			next = n
			if pages > 10 {
				t.Fatal("no end")
			}
		}
		if len(seen) != len(want) {
			t.Fatalf("%s: saw %v, want %v", path, seen, want)
		}
		for i := range seen { // newest first
			if seen[i] != want[len(want)-1-i] {
				t.Fatalf("%s: saw %v", path, seen)
			}
		}
	}
	all := b.ok(b.do("GET", "/v1/jobs", b.ro, nil))["items"].([]any)
	if len(all) != 8 {
		t.Fatalf("all jobs: %d", len(all))
	}
	// A cursor of one ordering is refused by the other.
	first := b.ok(b.do("GET", "/v1/jobs?state=dead&limit=1", b.ro, nil))
	b.problem(b.do("GET", "/v1/jobs?limit=1&cursor="+first["next_cursor"].(string), b.ro, nil), 422)
}

func itoa[T int | int64](v T) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
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
