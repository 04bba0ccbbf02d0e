package admin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/scheduler"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// roleDB is a database migrated into schema relay by an owner role, with
// an application role granted only what docs/deploy.md lists.
type roleDB struct {
	super *pgx.Conn // superuser, in the database
	owner string    // the owner role's name
	app   string    // the application role's name
	// appURL connects as the application role, search_path relay.
	appURL string
}

// withUser is u connecting as role, with search_path relay.
func withUser(t *testing.T, u, role string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p.User = url.User(role)
	q := p.Query()
	q.Set("search_path", "relay")
	p.RawQuery = q.Encode()
	return p.String()
}

// deployGrants is the SQL of docs/deploy.md's grants block, for roles
// owner and app: the test runs what the page says.
func deployGrants(t *testing.T, owner, app string) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- grants -->\\s*```sql\\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/deploy.md has no ```sql block after <!-- grants -->")
	}
	return strings.NewReplacer("relay_owner", owner, "relay_app", app).Replace(string(m[1]))
}

// newRoleDB makes the roles (dropped when the test ends), then the
// database, runs the docs' grants and migrates as the owner.
func newRoleDB(t *testing.T) *roleDB {
	t.Helper()
	ctx := context.Background()
	b := make([]byte, 4)
	rand.Read(b)
	suffix := hex.EncodeToString(b)
	r := &roleDB{owner: "relay_owner_" + suffix, app: "relay_app_" + suffix}
	var serverURL string
	// Registered before the database is made, so it runs after the
	// database is dropped: the roles own nothing left then.
	t.Cleanup(func() {
		if serverURL == "" {
			return
		}
		p, _ := url.Parse(serverURL)
		p.Path = "/postgres"
		c, err := pgx.Connect(ctx, p.String())
		if err != nil {
			t.Errorf("drop roles: %v", err)
			return
		}
		defer c.Close(ctx)
		for _, role := range []string{r.app, r.owner} {
			if _, err := c.Exec(ctx, "DROP ROLE IF EXISTS "+role); err != nil {
				t.Errorf("drop role %s: %v", role, err)
			}
		}
	})
	serverURL = testdb.EmptyURL(t)
	super, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { super.Close(ctx) })
	r.super = super
	var db string
	if err := super.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		"CREATE ROLE " + r.owner + " LOGIN",
		"CREATE ROLE " + r.app + " LOGIN",
		"GRANT CREATE ON DATABASE " + db + " TO " + r.owner,
		// Hardened as PostgreSQL's docs suggest: the owner's new
		// functions are not executable by PUBLIC, so the docs' grants
		// must give the application role EXECUTE itself.
		"ALTER DEFAULT PRIVILEGES FOR ROLE " + r.owner + " REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC",
		// No temporary tables either: Relay makes none.
		"REVOKE TEMPORARY ON DATABASE " + db + " FROM PUBLIC",
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
	} {
		if _, err := super.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	ownerConn, err := pgx.Connect(ctx, withUser(t, serverURL, r.owner))
	if err != nil {
		t.Fatal(err)
	}
	defer ownerConn.Close(ctx)
	if _, err := ownerConn.Exec(ctx, "CREATE SCHEMA relay"); err != nil {
		t.Fatal(err)
	}
	ownerPool, err := pgxpool.New(ctx, withUser(t, serverURL, r.owner))
	if err != nil {
		t.Fatal(err)
	}
	defer ownerPool.Close()
	if _, err := migrations.Migrate(ctx, ownerPool); err != nil {
		t.Fatalf("migrate as the owner: %v", err)
	}
	if _, err := ownerConn.Exec(ctx, deployGrants(t, r.owner, r.app)); err != nil {
		t.Fatalf("docs/deploy.md's grants: %v", err)
	}
	// Relay's triggers call its functions by name, through the session's
	// search_path: every session writing its tables needs the schema there.
	if _, err := super.Exec(ctx, "SET search_path = relay, public"); err != nil {
		t.Fatal(err)
	}
	r.appURL = withUser(t, serverURL, r.app)
	return r
}

type roleJob struct {
	Via string `json:"via"`
}

func (roleJob) Kind() string { return "role-job" }

type roleEvent struct{ outbox.Delivery }

func (roleEvent) Kind() string { return "role-event" }

// The queue, the workflow layer, the scheduler, the outbox and the admin
// API run as a role granted only what docs/deploy.md lists (no superuser,
// no CREATE anywhere, no temporary tables), in a schema other than public;
// a grant taken away makes a client's Start fail naming the table and the
// privilege.
func TestRunsAsRoleThatOwnsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRoleDB(t)
	pool, err := pgxpool.New(ctx, r.appURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var super, create bool
	if err := pool.QueryRow(ctx, `SELECT rolsuper, has_schema_privilege('relay', 'CREATE') FROM pg_roles WHERE rolname = current_user`).Scan(&super, &create); err != nil || super || create {
		t.Fatalf("the application role: superuser %v, CREATE on relay %v (%v)", super, create, err)
	}

	ran := make(chan string, 16)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[roleJob](func(ctx context.Context, j *core.Job[roleJob]) error {
		ran <- j.Args.Via
		return nil
	}))
	core.MustAddWorker(ws, core.WorkFunc[roleEvent](func(ctx context.Context, j *core.Job[roleEvent]) error {
		ran <- "outbox"
		return nil
	}))
	reg := workflow.NewRegistry(pool, nil)
	wf := workflow.MustRegister(reg, "role-flow", func(wctx workflow.Context, in string) (string, error) {
		return workflow.Step(wctx, "greet", func(ctx context.Context) (string, error) { return "hello " + in, nil }, nil)
	})
	reg.AddWorkers(ws)
	client, err := core.NewClient(pool, &core.Config{Workers: ws, PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatalf("start a worker client as the application role: %v", err)
	}
	defer stopBounded(t, client.Stop)

	sched, err := scheduler.New(pool, &scheduler.Config{Schedules: []scheduler.Schedule{{Name: "role-every-second", Spec: "@every 1s", Args: roleJob{Via: "scheduler"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sched.Start(ctx); err != nil {
		t.Fatalf("start the scheduler as the application role: %v", err)
	}
	defer stopBounded(t, sched.Stop)
	disp, err := outbox.NewDispatcher(pool, &outbox.Config{Subscriptions: []outbox.Subscription{{Topic: "role.topic", Kind: "role-event"}}, PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := disp.Start(ctx); err != nil {
		t.Fatalf("start the outbox dispatcher as the application role: %v", err)
	}
	defer stopBounded(t, disp.Stop)

	if _, err := core.Enqueue(ctx, pool, roleJob{Via: "enqueue"}, nil); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Publish(ctx, tx, outbox.Event{Topic: "role.topic", Key: "k", Payload: map[string]int{"n": 1}})
		return err
	}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	h, err := workflow.Start(ctx, pool, wf, "role", nil)
	if err != nil {
		t.Fatalf("start a workflow run: %v", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if out, err := h.Result(rctx, pool); err != nil || out != "hello role" {
		t.Fatalf("workflow result: %q, %v", out, err)
	}
	seen := map[string]bool{}
	for len(seen) < 3 {
		select {
		case via := <-ran:
			seen[via] = true
		case <-rctx.Done():
			t.Fatalf("jobs run as the application role: %v; want enqueue, scheduler and outbox", seen)
		}
	}

	// The admin API: reads, and a write with its audit row.
	api, err := Handler(pool, &Config{Auth: &Auth{Issuer: testIssuer, Audience: testAudience, HS256Secret: testSecret}})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := MintToken(testSecret, TokenOpts{Issuer: testIssuer, Audience: testAudience, Subject: "operator"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/jobs"}, {"GET", "/v1/queues"}, {"GET", "/v1/workflows/runs"}, {"GET", "/v1/workflows/stats"}, {"GET", "/v1/audit"}, {"GET", "/v1/schedules"},
		{"GET", "/v1/outbox/events"}, {"POST", "/v1/queues/default/pause"}, {"POST", "/v1/queues/default/resume"},
	} {
		req := httptest.NewRequest(c.method, c.path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Errorf("%s %s as the application role: %d %s", c.method, c.path, rec.Code, rec.Body.String())
		}
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_admin_audit WHERE subject = 'operator'`); n < 2 {
		t.Errorf("%d audit rows for the admin writes, want 2", n)
	}

	// A grant taken away: Start names the role, the table and the
	// privilege. (The others stop first: they could not record their
	// jobs' outcomes without it.)
	stopBounded(t, disp.Stop)
	stopBounded(t, sched.Stop)
	stopBounded(t, client.Stop)
	for _, stmt := range []string{
		"REVOKE UPDATE ON relay.relay_jobs FROM " + r.app,
		"REVOKE EXECUTE ON FUNCTION relay.relay_process_live(timestamptz, float8) FROM " + r.app,
	} {
		if _, err := r.super.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	other, err := core.NewClient(pool, &core.Config{Workers: ws})
	if err != nil {
		t.Fatal(err)
	}
	err = other.Start(ctx)
	if err == nil {
		stopBounded(t, other.Stop)
	}
	if !errors.Is(err, core.ErrMissingGrants) || !strings.Contains(err.Error(), r.app) || !strings.Contains(err.Error(), "relay_jobs (UPDATE)") ||
		!strings.Contains(err.Error(), "relay_process_live(timestamp with time zone,double precision) (EXECUTE)") {
		t.Errorf("Start without UPDATE on relay_jobs and EXECUTE on relay_process_live: %v; want ErrMissingGrants naming %s, relay_jobs (UPDATE) and relay_process_live(timestamp with time zone,double precision) (EXECUTE)", err, r.app)
	}
}

// logSink is a log a test reads while the layers write to it.
type logSink struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// has says whether a line holds every one of words.
func (l *logSink) has(words ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
lines:
	for _, line := range strings.Split(l.buf.String(), "\n") {
		for _, w := range words {
			if !strings.Contains(line, w) {
				continue lines
			}
		}
		return true
	}
	return false
}

// With statement_timeout, idle_in_transaction_session_timeout and
// lock_timeout set low on the application role, as managed services set
// them, the bookkeeping keeps working: while another transaction holds
// relay_jobs locked against writes past those timeouts, claims,
// heartbeats, completions, rescues, the outbox dispatcher and the
// scheduler each fail a statement on it (lock timeout, 55P03, or statement
// timeout, 57014, whichever comes first) and retry, and once the lock goes
// every job, event, fire, rescue and workflow run finishes, none run
// twice.
func TestBookkeepingUnderRoleTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRoleDB(t)
	for _, set := range []string{"statement_timeout = '500ms'", "idle_in_transaction_session_timeout = '500ms'", "lock_timeout = '100ms'"} {
		if _, err := r.super.Exec(ctx, "ALTER ROLE "+r.app+" SET "+set); err != nil {
			t.Fatal(err)
		}
	}
	pool, err := pgxpool.New(ctx, r.appURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var st, it, lt string
	if err := pool.QueryRow(ctx, "SELECT current_setting('statement_timeout'), current_setting('idle_in_transaction_session_timeout'), current_setting('lock_timeout')").Scan(&st, &it, &lt); err != nil || st != "500ms" || it != "500ms" || lt != "100ms" {
		t.Fatalf("the role's timeouts: %s %s %s, %v", st, it, lt, err)
	}
	logs := &logSink{}
	logger := slog.New(slog.NewTextHandler(logs, nil))

	var ranMu sync.Mutex
	ran := map[string]int{}
	count := func(via string) {
		ranMu.Lock()
		ran[via]++
		ranMu.Unlock()
	}
	longStarted := make(chan struct{})
	var longOnce sync.Once
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[roleJob](func(ctx context.Context, j *core.Job[roleJob]) error {
		if j.Args.Via == "long" {
			// Runs through the lock: its lease must be renewed after a
			// heartbeat failed on it, for it to finish once.
			longOnce.Do(func() { close(longStarted) })
			select {
			case <-time.After(4 * time.Second):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		count(j.Args.Via)
		return nil
	}))
	core.MustAddWorker(ws, core.WorkFunc[roleEvent](func(ctx context.Context, j *core.Job[roleEvent]) error {
		count("outbox")
		return nil
	}))
	reg := workflow.NewRegistry(pool, &workflow.Config{Logger: logger})
	wf := workflow.MustRegister(reg, "timeouts-flow", func(wctx workflow.Context, in int) (int, error) {
		sum := 0
		for i := range 3 {
			n, err := workflow.Step(wctx, fmt.Sprint("step-", i), func(ctx context.Context) (int, error) { return in + i, nil }, nil)
			if err != nil {
				return 0, err
			}
			sum += n
			if i == 0 {
				if err := workflow.Sleep(wctx, "through-the-lock", time.Second); err != nil {
					return 0, err
				}
			}
		}
		return sum, nil
	})
	reg.AddWorkers(ws)
	client, err := core.NewClient(pool, &core.Config{Workers: ws, Logger: logger, PollInterval: 100 * time.Millisecond,
		LeaseDuration: 20 * time.Second, HeartbeatInterval: time.Second, RescueInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer stopBounded(t, client.Stop)
	sched, err := scheduler.New(pool, &scheduler.Config{Logger: logger, Schedules: []scheduler.Schedule{{Name: "timeouts-every-second", Spec: "@every 1s", Args: roleJob{Via: "scheduler"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sched.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer stopBounded(t, sched.Stop)
	disp, err := outbox.NewDispatcher(pool, &outbox.Config{Logger: logger, Subscriptions: []outbox.Subscription{{Topic: "timeouts.topic", Kind: "role-event"}}, PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := disp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer stopBounded(t, disp.Stop)

	// A lease that expired with no worker: the rescuer's to requeue.
	lost, err := core.Enqueue(ctx, pool, roleJob{Via: "rescued"}, &core.EnqueueOpts{Queue: "elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.super.Exec(ctx, `UPDATE relay.relay_jobs SET state = 'claimed', attempt = 1, attempted_at = now(), queue = 'default',
		lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second' WHERE id = $1`, lost.ID); err != nil {
		t.Fatal(err)
	}
	long, err := core.Enqueue(ctx, pool, roleJob{Via: "long"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var runs []workflow.Handle[int]
	for i := range 8 {
		h, err := workflow.Start(ctx, pool, wf, i, nil)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, h)
	}
	<-longStarted

	// Hold relay_jobs locked against writes until each layer has failed a
	// statement on it.
	lockCtx, unlock := context.WithCancel(ctx)
	defer unlock()
	lockHeld, locked := make(chan struct{}), make(chan error, 1)
	go func() {
		// The transaction ends under ctx, not lockCtx: a commit sent on a
		// cancelled context is abandoned by pgx, which closes the
		// connection while its backend may still hold the lock, and the
		// enqueues after unlock (under a 100 ms lock_timeout) then failed
		// with 55P03 on a loaded machine (seen once in CI).
		locked <- pgx.BeginFunc(ctx, r.super, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `LOCK TABLE relay.relay_jobs IN SHARE MODE`); err != nil {
				return err
			}
			close(lockHeld)
			<-lockCtx.Done()
			return nil
		})
	}()
	<-lockHeld
	lockedAt := time.Now()
	_, err = core.Enqueue(ctx, pool, roleJob{Via: "enqueue"}, nil)
	if !strings.Contains(fmt.Sprint(err), "55P03") {
		t.Errorf("an enqueue during the lock: %v; want the role's lock_timeout (55P03)", err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Publish(ctx, tx, outbox.Event{Topic: "timeouts.topic", Key: "k", Payload: 1})
		return err
	}); err != nil {
		t.Fatalf("publish (relay_outbox is not locked): %v", err)
	}
	for _, words := range [][]string{{"claim failed", "SQLSTATE"}, {"heartbeat failed", "SQLSTATE"}, {"recording attempts' outcomes failed; retrying", "SQLSTATE"}, {"rescue failed", "55P03"}, {"outbox dispatch failed", "55P03"}, {"scheduler tick failed", "55P03"}} {
		deadline := time.Now().Add(30 * time.Second)
		for !logs.has(words...) {
			if time.Now().After(deadline) {
				logs.mu.Lock()
				t.Fatalf("no line with %q in 30s; the log:\n%s", words, logs.buf.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	unlock()
	// A lock held past the lease (waiting for every layer's line on a
	// loaded machine) lets the long job's lease expire, and it rightly runs
	// again: at-least-once. Its once-only check holds only when the lock,
	// the completer's retry pause after it (up to 5 s) and a heartbeat
	// interval fit in the 20 s lease: an outcome waiting in the completer
	// is not heartbeated, so a lock of 18 s plus a 5 s pause let the lease
	// expire and the job run again (seen once in CI).
	longOnceOnly := time.Since(lockedAt) < 20*time.Second-5*time.Second-2*time.Second
	if err := <-locked; err != nil {
		t.Fatalf("lock holder: %v", err)
	}

	// After the lock: everything finishes, once.
	var ids []int64
	for i := range 10 {
		res, err := core.Enqueue(ctx, pool, roleJob{Via: "enqueue"}, nil)
		if err != nil {
			t.Fatalf("enqueue %d after the lock: %v", i, err)
		}
		ids = append(ids, res.ID)
	}
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for i, h := range runs {
		if out, err := h.Result(rctx, pool); err != nil || out != 3*i+3 {
			t.Fatalf("run %d: %d, %v", i, out, err)
		}
	}
	once := ids
	if longOnceOnly {
		once = append(once, long.ID)
	} else {
		waitState(t, pool, long.ID, core.StateSucceeded)
		t.Logf("the lock outlasted the long job's lease: it may run again")
	}
	for _, id := range once {
		if j := waitState(t, pool, id, core.StateSucceeded); j.Attempt != 1 {
			t.Errorf("job %d ran %d times", id, j.Attempt)
		}
	}
	if j := waitState(t, pool, lost.ID, core.StateSucceeded); j.Attempt != 2 {
		t.Errorf("the rescued job: attempt %d, want 2", j.Attempt)
	}
	testdb.WaitFor(t, "the outbox event's job and a scheduled fire after the lock", func() bool {
		ranMu.Lock()
		defer ranMu.Unlock()
		return ran["outbox"] >= 1 && ran["scheduler"] >= 1
	})
	ranMu.Lock()
	defer ranMu.Unlock()
	if (longOnceOnly && ran["long"] != 1) || ran["long"] < 1 || ran["outbox"] != 1 || ran["rescued"] != 1 {
		t.Errorf("handlers ran: %v; want the long job, the rescued job and the event once each", ran)
	}
	if logs.has("idle-in-transaction") {
		t.Errorf("a session idled in a transaction past the role's timeout:\n%s", logs.buf.String())
	}
}

// stopBounded stops a client, scheduler or dispatcher within 10 s (a
// second stop is a no-op), so that a failed test ends rather than hangs.
func stopBounded(t *testing.T, stop func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stop(ctx) //nolint:errcheck // outcomes it could not record run again; the test checks what it needs
}

func waitState(t *testing.T, pool *pgxpool.Pool, id int64, want core.JobState) *core.JobRow {
	t.Helper()
	var j *core.JobRow
	defer func() {
		if t.Failed() && j != nil {
			t.Logf("job %d (%s): state %s, attempt %d, errors %v", id, j.Kind, j.State, j.Attempt, j.History)
		}
	}()
	testdb.WaitFor(t, fmt.Sprintf("job %d to be %s", id, want), func() bool {
		var err error
		if j, err = core.JobGet(context.Background(), pool, id); err != nil {
			t.Fatal(err)
		}
		return j.State == want
	})
	return j
}
