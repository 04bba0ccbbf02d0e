package admin

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/idempotency"
	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/scheduler"
	"github.com/relayq/relay/testkit/testdb"
)

type countArgs struct{}

func (countArgs) Kind() string { return "count" }

func startClient(t *testing.T, pool *pgxpool.Pool, cfg *core.Config) *core.Client {
	t.Helper()
	c, err := core.NewClient(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Stop(ctx)
	})
	return c
}

// TestQueuePauseThroughAPI: a pause made through the API is honoured by two
// clients with their own pools (as two worker processes), shows in the queue
// stats, and resume lets the jobs run.
func TestQueuePauseThroughAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool2, err := pgxpool.New(b.ctx, b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool2.Close)
	var ran atomic.Int64
	cfg := func() *core.Config {
		ws := core.NewWorkers()
		core.MustAddWorker(ws, core.WorkFunc[countArgs](func(context.Context, *core.Job[countArgs]) error { ran.Add(1); return nil }))
		return &core.Config{Workers: ws, PollInterval: 50 * time.Millisecond,
			Queues: map[string]core.QueueConfig{"emails": {MaxWorkers: 2}, "other": {MaxWorkers: 1}}}
	}
	startClient(t, b.pool, cfg())
	startClient(t, pool2, cfg())

	p := b.ok(b.do("POST", "/v1/queues/emails/pause", b.rw, nil))
	if p["paused"] != true || p["changed"] != true {
		t.Fatalf("pause: %v", p)
	}
	for range 5 {
		if _, err := core.Enqueue(b.ctx, b.pool, countArgs{}, &core.EnqueueOpts{Queue: "emails"}); err != nil {
			t.Fatal(err)
		}
	}
	marker, err := core.Enqueue(b.ctx, b.pool, countArgs{}, &core.EnqueueOpts{Queue: "other"})
	if err != nil {
		t.Fatal(err)
	}
	testdb.WaitFor(t, "the other queue's job", func() bool { return b.state(marker.ID) == "succeeded" })
	time.Sleep(500 * time.Millisecond) // ten poll intervals: the window of a negative check
	q := b.ok(b.do("GET", "/v1/queues/emails", b.ro, nil))
	if q["paused"] != true || q["runnable"].(float64) != 5 || q["running"].(float64) != 0 || q["paused_by"] != b.subject {
		t.Fatalf("paused queue: %s", mustJSON(q))
	}
	if q["dead"].(float64) != 0 {
		t.Fatalf("dead: %v", q["dead"])
	}
	if q["oldest_runnable_age_seconds"].(float64) <= 0 {
		t.Fatalf("oldest age: %v", q["oldest_runnable_age_seconds"])
	}

	b.ok(b.do("POST", "/v1/queues/emails/resume", b.rw, nil))
	testdb.WaitFor(t, "the paused jobs to run", func() bool { return ran.Load() == 6 })
	testdb.WaitFor(t, "stats to show them", func() bool {
		qs := b.ok(b.do("GET", "/v1/queues?window_minutes=5", b.ro, nil))["items"].([]any)
		for _, it := range qs {
			m := it.(map[string]any)
			if m["name"] == "emails" {
				return m["succeeded"].(float64) == 5 && m["paused"] == false && len(m["minutes"].([]any)) >= 1
			}
		}
		return false
	})
	actions := b.count(`SELECT count(*) FROM relay_admin_audit WHERE action IN ('queues.pause', 'queues.resume') AND subject = $1`, b.subject)
	if actions != 2 {
		t.Fatalf("%d audit rows for pause/resume", actions)
	}
	b.problem(b.do("GET", "/v1/queues?window_minutes=61", b.ro, nil), 422)
}

type slowArgs struct {
	Fail bool `json:"fail"`
}

func (slowArgs) Kind() string { return "slow" }

// TestBulkBesideRunningWorkers: with jobs running, a bulk requeue of the
// queue touches only its dead and cancelled jobs, in bounded batches, and the
// running jobs finish; a bulk cancel of the running jobs ends their leases,
// so their workers' late successes are refused by the fence.
func TestBulkBesideRunningWorkers(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	h, err := Handler(pool, &Config{NoAuth: true, BulkBatchSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{t: t, pool: pool, h: h, ctx: context.Background(), subject: "anonymous"}

	release := make(chan struct{})
	var started atomic.Int64
	var once sync.Once
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[slowArgs](func(ctx context.Context, j *core.Job[slowArgs]) error {
		started.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			<-release // finish anyway, as a handler that ignores cancellation would
		}
		if j.Args.Fail {
			return core.Permanent(errors.New("still broken"))
		}
		return nil
	}))
	// The dead jobs first, before any worker could claim them.
	var dead []int64
	for range 7 {
		dead = append(dead, b.job("slow", "bulk", core.StateDead, "earlier failure"))
	}
	c := startClient(t, pool, &core.Config{Workers: ws, PollInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{"bulk": {MaxWorkers: 4}}})
	defer once.Do(func() { close(release) })
	var running []int64
	for range 4 {
		r, err := core.Enqueue(b.ctx, pool, slowArgs{}, &core.EnqueueOpts{Queue: "bulk"})
		if err != nil {
			t.Fatal(err)
		}
		running = append(running, r.ID)
	}
	testdb.WaitFor(t, "four jobs running", func() bool { return started.Load() == 4 })

	// Pause the queue so requeued jobs stay visible as queued.
	b.ok(b.do("POST", "/v1/queues/bulk/pause", "", nil))
	dry := b.ok(b.do("POST", "/v1/jobs/bulk", "", map[string]any{"action": "requeue", "filter": map[string]any{"queue": "bulk"}, "dry_run": true}))
	if dry["matched"].(float64) != 7 || dry["changed"].(float64) != 0 {
		t.Fatalf("dry run: %v", dry)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs WHERE state = 'dead'`); n != 7 {
		t.Fatalf("dry run changed something: %d dead", n)
	}
	res := b.ok(b.do("POST", "/v1/jobs/bulk", "", map[string]any{"action": "requeue", "filter": map[string]any{"queue": "bulk"}}))
	if res["matched"].(float64) != 7 || res["changed"].(float64) != 7 || res["batches"].(float64) != 3 {
		t.Fatalf("bulk requeue: %v", res)
	}
	for _, id := range dead {
		if s := b.state(id); s != "queued" {
			t.Fatalf("dead job %d is %s", id, s)
		}
	}
	for _, id := range running {
		if s := b.state(id); s != "claimed" {
			t.Fatalf("running job %d is %s after the bulk requeue", id, s)
		}
	}
	if n := b.count(`SELECT count(*) FROM relay_admin_audit WHERE action = 'jobs.bulk_requeue'`); n != 3 {
		t.Fatalf("%d audit rows, want one per batch (3)", n)
	}

	// Cancel the running ones by filter: their leases end.
	res = b.ok(b.do("POST", "/v1/jobs/bulk", "", map[string]any{"action": "cancel", "filter": map[string]any{"queue": "bulk", "state": "claimed"}}))
	if res["changed"].(float64) != 4 {
		t.Fatalf("bulk cancel: %v", res)
	}
	once.Do(func() { close(release) })
	testdb.WaitFor(t, "the cancelled workers to be fenced off", func() bool { return c.Stats().LeaseLost >= 4 })
	for _, id := range running {
		if s := b.state(id); s != "cancelled" {
			t.Fatalf("cancelled job %d is %s: a late worker wrote through the fence", id, s)
		}
	}
	// The requeued jobs run once the queue resumes.
	b.ok(b.do("POST", "/v1/queues/bulk/resume", "", nil))
	for _, id := range dead {
		testdb.WaitFor(t, "requeued job to succeed", func() bool { return b.state(id) == "succeeded" })
	}
}

// TestListDeadJobsUsesIndex: the first page of dead jobs is read from
// relay_jobs_finalized_idx, not by scanning the finished rows, beside
// 1,000,000 finished rows (about 5 s to build on the CI machine, triggers
// off; the test logs the plan with its execution time).
func TestListDeadJobsUsesIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(`ALTER TABLE relay_jobs DISABLE TRIGGER USER`)
	b.exec(`INSERT INTO relay_jobs (kind, queue, state, attempt, run_at, created_at, attempted_at, finalized_at, last_error)
		SELECT 'bulk.kind', 'q' || (g % 5), CASE WHEN g % 100 = 0 THEN 'dead' ELSE 'succeeded' END, 1,
		       now() - g * interval '1 second', now() - g * interval '1 second', now() - g * interval '1 second',
		       now() - g * interval '1 second' + interval '10 ms', CASE WHEN g % 100 = 0 THEN 'boom' END
		FROM generate_series(1, 1000000) AS g`)
	b.exec(`ALTER TABLE relay_jobs ENABLE TRIGGER USER`)
	// Vacuumed, as autovacuum leaves a table of old finished rows: the
	// visibility map lets the counts read indexes only.
	b.exec(`VACUUM ANALYZE relay_jobs`)

	for _, f := range []jobFilter{{States: []string{"dead"}}, {States: []string{"dead"}, Queue: "q0", Kind: "bulk.kind"}} {
		sql, args := sqlListJobsByFinalized(f, nil, defaultLimit+1)
		plan := explain(t, b.pool, sql, args...)
		if !strings.Contains(plan, "relay_jobs_finalized_idx") || strings.Contains(plan, "Seq Scan") {
			t.Fatalf("first page of dead jobs does not use the index:\n%s", plan)
		}
		t.Logf("plan:\n%s", plan)
	}
	// Lists of the active states go by id, on their partial indexes.
	for _, st := range []string{"queued", "claimed"} {
		sql, args := sqlListJobsByID(jobFilter{States: []string{st}}, nil, defaultLimit+1)
		if plan := explain(t, b.pool, sql, args...); strings.Contains(plan, "Seq Scan") {
			t.Fatalf("list of %s jobs scans the table:\n%s", st, plan)
		}
	}

	// The queue stats read partial indexes only, never the finished rows
	// outside the window.
	for _, q := range []string{"", "q1"} {
		plan := explain(t, b.pool, sqlQueueStats, 15, q)
		if strings.Contains(plan, "Seq Scan on relay_jobs") {
			t.Fatalf("queue stats scan the table:\n%s", plan)
		}
		// The dead count per queue reads the dead rows' own index, not
		// every dead row from the heap.
		if !strings.Contains(plan, "relay_jobs_dead_idx") {
			t.Fatalf("queue stats do not count dead jobs on relay_jobs_dead_idx:\n%s", plan)
		}
		plan = explain(t, b.pool, sqlQueueMinutes, 15, q)
		if strings.Contains(plan, "Seq Scan on relay_jobs") {
			t.Fatalf("queue minutes scan the table:\n%s", plan)
		}
	}

	// A filter checked row by row examines at most listScanRows jobs of
	// the order; a tag filter is served by the tags' GIN index.
	for _, f := range []jobFilter{{Kind: "rare.kind"}, {States: []string{"succeeded"}, Kind: "rare.kind", Queue: "q1"}} {
		sql, args := sqlListJobsByID(f, nil, defaultLimit+1)
		if len(f.States) > 0 {
			sql, args = sqlListJobsByFinalized(f, nil, defaultLimit+1)
		}
		plan := explain(t, b.pool, sql, args...)
		if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "rows=10000 ") {
			t.Fatalf("a kind matching nothing walked more than %d jobs:\n%s", listScanRows, plan)
		}
	}
	b.exec(`UPDATE relay_jobs SET tags = '{needle}' WHERE id IN (SELECT id FROM relay_jobs ORDER BY id LIMIT 20)`)
	b.exec(`ANALYZE relay_jobs`)
	sql, args := sqlListJobsByID(jobFilter{Tags: []string{"needle"}}, nil, defaultLimit+1)
	if plan := explain(t, b.pool, sql, args...); !strings.Contains(plan, "relay_jobs_tags_idx") {
		t.Fatalf("a tag filter does not use relay_jobs_tags_idx:\n%s", plan)
	}

	page := b.ok(b.do("GET", "/v1/jobs?state=dead&limit=50", b.ro, nil))
	if n := len(page["items"].([]any)); n != 50 || page["next_cursor"] == nil {
		t.Fatalf("page of %d dead jobs", n)
	}
	// The second page starts at the cursor, on the index too.
	var c cursor
	cur, err := decodeCursor(page["next_cursor"].(string), "jobs-dead")
	if err != nil {
		t.Fatal(err)
	}
	c = *cur
	sql, args = sqlListJobsByFinalized(jobFilter{States: []string{"dead"}}, &c, defaultLimit+1)
	if plan := explain(t, b.pool, sql, args...); !strings.Contains(plan, "relay_jobs_finalized_idx") {
		t.Fatalf("second page:\n%s", plan)
	}
}

func explain(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

type tickArgs struct{}

func (tickArgs) Kind() string { return "tick" }

// TestSchedulesOutboxIdempotency: the other resources, read and changed.
func TestSchedulesOutboxIdempotency(t *testing.T) {
	t.Parallel()
	b := setup(t)

	// Schedules: declared by a scheduler, paused, resumed, triggered.
	sch, err := scheduler.New(b.pool, &scheduler.Config{Schedules: []scheduler.Schedule{
		{Name: "nightly", Spec: "0 3 * * *", TimeZone: "Europe/Paris", Args: tickArgs{}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Declare(b.ctx); err != nil {
		t.Fatal(err)
	}
	list := b.ok(b.do("GET", "/v1/schedules?next=3", b.ro, nil))["items"].([]any)
	if len(list) != 1 {
		t.Fatalf("schedules: %s", mustJSON(list))
	}
	s0 := list[0].(map[string]any)
	if s0["name"] != "nightly" || len(s0["next_fires"].([]any)) != 3 || s0["time_zone"] != "Europe/Paris" {
		t.Fatalf("schedule: %s", mustJSON(s0))
	}
	// One format for every next fire: RFC 3339 in UTC (the first came from
	// the database with Z, the others from the spec with +01:00), each
	// 03:00 in Paris.
	paris, _ := time.LoadLocation("Europe/Paris")
	for _, v := range s0["next_fires"].([]any) {
		at, err := time.Parse(time.RFC3339Nano, v.(string))
		if !strings.HasSuffix(v.(string), "Z") || err != nil || at.In(paris).Hour() != 3 {
			t.Fatalf("next fire %q: want RFC 3339 in UTC, 03:00 in Paris", v)
		}
	}
	b.ok(b.do("POST", "/v1/schedules/nightly/pause", b.rw, nil))
	if got := b.ok(b.do("GET", "/v1/schedules/nightly", b.ro, nil)); got["paused"] != true {
		t.Fatalf("not paused: %v", got)
	}
	b.ok(b.do("POST", "/v1/schedules/nightly/resume", b.rw, nil))
	tr := b.ok(b.do("POST", "/v1/schedules/nightly/trigger", b.rw, nil))
	if tr["job_id"].(float64) <= 0 {
		t.Fatalf("trigger: %v", tr)
	}
	got := b.ok(b.do("GET", "/v1/schedules/nightly", b.ro, nil))
	if fires := got["last_fires"].([]any); len(fires) != 1 || fires[0].(map[string]any)["outcome"] != "triggered" {
		t.Fatalf("last fires: %s", mustJSON(got["last_fires"]))
	}
	b.problem(b.do("POST", "/v1/schedules/nope/pause", b.rw, nil), 404)
	b.problem(b.do("GET", "/v1/schedules/nope", b.ro, nil), 404)

	// Outbox: a pending event, then dispatched, then redispatched.
	id, err := outbox.Publish(b.ctx, b.pool, outbox.Event{Topic: "order.paid", Key: "order-1", Payload: map[string]int{"order": 1}})
	if err != nil {
		t.Fatal(err)
	}
	ev := b.ok(b.do("GET", "/v1/outbox/events?state=pending", b.ro, nil))["items"].([]any)
	if len(ev) != 1 || ev[0].(map[string]any)["topic"] != "order.paid" {
		t.Fatalf("pending events: %s", mustJSON(ev))
	}
	b.problem(b.do("POST", "/v1/outbox/events/"+itoa(id)+"/redispatch", b.rw, nil), 409)
	b.exec(`UPDATE relay_outbox SET dispatched_at = now(), jobs = 1 WHERE id = $1`, id)
	b.ok(b.do("POST", "/v1/outbox/events/"+itoa(id)+"/redispatch", b.rw, nil))
	if n := b.count(`SELECT count(*) FROM relay_outbox WHERE dispatched_at IS NULL`); n != 1 {
		t.Fatal("event not pending after redispatch")
	}
	b.problem(b.do("POST", "/v1/outbox/events/99999/redispatch", b.rw, nil), 404)
	b.problem(b.do("GET", "/v1/outbox/events?state=lost", b.ro, nil), 422)

	// A blocked key: a dead job at the head of an ordering key.
	head, err := core.Enqueue(b.ctx, b.pool, testArgs{"ship"}, &core.EnqueueOpts{Queue: "ord", OrderingKey: "order-9", MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := core.Enqueue(b.ctx, b.pool, testArgs{"ship"}, &core.EnqueueOpts{Queue: "ord", OrderingKey: "order-9"}); err != nil {
		t.Fatal(err)
	}
	b.exec(`UPDATE relay_jobs SET state = 'claimed', attempt = 1, attempted_at = now(), lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute' WHERE id = $1`, head.ID)
	b.exec(`UPDATE relay_jobs SET state = 'dead', lease_token = NULL, lease_expires_at = NULL, finalized_at = now(), last_error = 'no stock' WHERE id = $1`, head.ID)
	keys := b.ok(b.do("GET", "/v1/outbox/blocked-keys", b.ro, nil))["items"].([]any)
	if len(keys) != 1 {
		t.Fatalf("blocked keys: %s", mustJSON(keys))
	}
	k := keys[0].(map[string]any)
	if k["key"] != "order-9" || k["waiting"].(float64) != 1 || k["head"].(map[string]any)["last_error"] != "no stock" {
		t.Fatalf("blocked key: %s", mustJSON(k))
	}

	// Idempotency keys: look up, delete.
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := idempotency.Once(b.ctx, tx, "payments", "charge-42", func(context.Context) (string, error) { return "ch_1", nil }, nil); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	key := b.ok(b.do("GET", "/v1/idempotency-keys?scope=payments&key=charge-42", b.ro, nil))
	if key["status"] != "succeeded" || string(mustJSON(key["result"])) != `"ch_1"` {
		t.Fatalf("key: %s", mustJSON(key))
	}
	b.problem(b.do("GET", "/v1/idempotency-keys?scope=payments", b.ro, nil), 422)
	b.problem(b.do("DELETE", "/v1/idempotency-keys?scope=payments&key=charge-42", b.ro, nil), 403)
	b.ok(b.do("DELETE", "/v1/idempotency-keys?scope=payments&key=charge-42", b.rw, nil))
	b.problem(b.do("GET", "/v1/idempotency-keys?scope=payments&key=charge-42", b.ro, nil), 404)

	// Every change is in the audit log, newest first.
	var actions []string
	for _, e := range b.ok(b.do("GET", "/v1/audit?limit=500", b.ro, nil))["items"].([]any) {
		actions = append(actions, e.(map[string]any)["action"].(string))
	}
	want := "idempotency.delete outbox.redispatch schedules.trigger schedules.resume schedules.pause"
	if strings.Join(actions, " ") != want {
		t.Fatalf("audit actions %v, want %s", actions, want)
	}
}

// TestOpenAPIMatchesHandlers: the document is OpenAPI 3.1, generated from
// the registered operations, and every path and method in it is served (not
// a routing 404/405) — so the document and the handlers cannot drift. Every
// operation also declares its bearer scope.
func TestOpenAPIMatchesHandlers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do("GET", "/openapi.json", "", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("/openapi.json: %d", r.Status)
	}
	var doc struct {
		OpenAPI string                                           `json:"openapi"`
		Paths   map[string]map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(r.Body, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" || len(doc.Paths) < 10 {
		t.Fatalf("openapi %q with %d paths", doc.OpenAPI, len(doc.Paths))
	}
	ops := 0
	for path, methods := range doc.Paths {
		for method, o := range methods {
			ops++
			if !strings.Contains(string(o["security"]), "relay:") {
				t.Errorf("%s %s declares no scope", method, path)
			}
			concrete := strings.NewReplacer("{id}", "1", "{name}", "x").Replace(path)
			resp := b.do(strings.ToUpper(method), concrete, "", nil)
			// Served by an operation: the auth middleware answers 401, where
			// an unknown route would be a 404 and a wrong method a 405.
			if resp.Status != http.StatusUnauthorized {
				t.Errorf("%s %s (documented) answers %d: %s", method, path, resp.Status, resp.Body)
			}
		}
	}
	t.Logf("%d operations documented and served", ops)
}

// TestDocsListEveryEndpoint: docs/admin.md has a heading for every
// operation in the OpenAPI document, and none for an operation that is not.
func TestDocsListEveryEndpoint(t *testing.T) {
	t.Parallel()
	_, api, err := newAPI(testdb.New(t), &Config{NoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	docs, err := os.ReadFile("../docs/admin.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^#### ((?:GET|POST|DELETE|PUT|PATCH) \\S+)$").FindAllStringSubmatch(string(docs), -1) {
		documented[m[1]] = true
	}
	served := map[string]bool{}
	for path, item := range api.OpenAPI().Paths {
		for method, o := range map[string]*huma.Operation{"GET": item.Get, "POST": item.Post, "DELETE": item.Delete, "PUT": item.Put, "PATCH": item.Patch} {
			if o != nil {
				served[method+" "+path] = true
			}
		}
	}
	for op := range served {
		if !documented[op] {
			t.Errorf("docs/admin.md lacks %q", op)
		}
	}
	for op := range documented {
		if !served[op] {
			t.Errorf("docs/admin.md documents %q, which is not served", op)
		}
	}
}

// TestBulkTimeBudget: a bulk operation whose time budget runs out answers
// done: false with what it did, and the same request again continues.
func TestBulkTimeBudget(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	short, err := Handler(pool, &Config{NoAuth: true, BulkTimeBudget: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{t: t, pool: pool, h: short, ctx: context.Background()}
	for range 3 {
		b.job("k", "q", core.StateDead, "e")
	}
	req := map[string]any{"action": "requeue", "filter": map[string]any{"kind": "k"}}
	r := b.ok(b.do("POST", "/v1/jobs/bulk", "", req))
	if r["done"] != false || r["changed"].(float64) != 0 {
		t.Fatalf("out of budget: %v", r)
	}
	b.h, err = Handler(pool, &Config{NoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	r = b.ok(b.do("POST", "/v1/jobs/bulk", "", req))
	if r["done"] != true || r["changed"].(float64) != 3 {
		t.Fatalf("second run: %v", r)
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

// TestScheduleChangesNeedOneConnection: a schedule change (made through the
// scheduler package, in the audit row's transaction) holds one connection,
// so it works on a pool of one connection — and concurrent changes cannot
// starve each other (or a service's workers on a shared pool) of
// connections. A trigger's audit row names the job it enqueued.
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
	if n := b.count(`SELECT count(*) FROM relay_admin_audit AS a JOIN relay_schedule_fires AS f ON f.job_id = (a.target->>'job_id')::bigint
		WHERE a.action = 'schedules.trigger' AND f.outcome = 'triggered'`); n != 1 {
		t.Fatalf("the trigger's audit row names %d triggered fires' jobs, want 1", n)
	}
	b.problem(b.do("POST", "/v1/schedules/nope/pause", b.rw, nil), 404)
	if n := b.count(`SELECT count(*) FROM relay_admin_audit`); n != 3 {
		t.Fatalf("a refused schedule change was audited (%d rows)", n)
	}
}
