package ui_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/admin"
	"github.com/relayq/relay/admin/ui"
	"github.com/relayq/relay/core"
	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/scheduler"
	"github.com/relayq/relay/testkit/browsertest"
	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

var secret = []byte("0123456789abcdef0123456789abcdef-ui-test")

const (
	issuer   = "relay-ui-test"
	audience = "relay-admin"
	traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
)

type receiptArgs struct {
	To string `json:"to"`
}

func (receiptArgs) Kind() string { return "receipt.send" }

type welcomeArgs struct {
	User int `json:"user"`
}

func (welcomeArgs) Kind() string { return "welcome.send" }

type plainArgs struct{ K string }

func (a plainArgs) Kind() string { return a.K }

// fixture is a database with jobs in every state, a paused queue, a blocked
// ordering key, a schedule and outbox events; the admin handler with the
// dashboard served by httptest; a worker client on queue "mail" whose
// receipt.send fails until fixed is set; and tokens.
type fixture struct {
	t      *testing.T
	ctx    context.Context
	pool   *pgxpool.Pool
	url    string // the dashboard
	rw, ro string
	fixed  atomic.Bool
	dead   int64 // receipt.send, dead after 3 failed attempts by the worker
	dead2  int64 // a second dead job of queue billing (the blocked key's head)
	shots  string
	login  *ui.OneTimeLogin
}

func setup(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{t: t, ctx: ctx, pool: testdb.New(t)}
	f.shots = os.Getenv("RELAY_UI_SCREENSHOTS")
	if f.shots == "" {
		f.shots = t.TempDir()
	}
	f.login = ui.NewOneTimeLogin(func() (string, error) { return f.token("dashboard-login", admin.ScopeRead, admin.ScopeWrite), nil })
	h, err := admin.Handler(f.pool, &admin.Config{
		Auth:           &admin.Auth{Issuer: issuer, Audience: audience, HS256Secret: secret},
		TraceURL:       "http://tracing.invalid/trace/{trace_id}",
		DashboardLogin: f.login,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Mounted under a prefix, as a service mounts it next to its workers:
	// the pages find the API relative to themselves.
	mux := http.NewServeMux()
	mux.Handle("/relay/", http.StripPrefix("/relay", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f.url = srv.URL + "/relay/ui/"
	f.rw = f.token("alice@example.com", admin.ScopeRead, admin.ScopeWrite)
	f.ro = f.token("reader@example.com", admin.ScopeRead)

	// The worker: welcome.send succeeds, receipt.send fails (with a stack)
	// until fixed.
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[welcomeArgs](func(context.Context, *core.Job[welcomeArgs]) error { return nil }))
	core.MustAddWorker(ws, core.WorkFunc[receiptArgs](func(_ context.Context, j *core.Job[receiptArgs]) error {
		if f.fixed.Load() {
			return nil
		}
		return fmt.Errorf("smtp: 550 mailbox unavailable for %s (attempt %d)\n\ngoroutine 42 [running]:\nmain.sendReceipt(...)\n\t/app/mail.go:88 +0x1d", j.Args.To, j.Attempt)
	}))
	client, err := core.NewClient(f.pool, &core.Config{
		Workers:     ws,
		Queues:      map[string]core.QueueConfig{"mail": {MaxWorkers: 2}},
		RetryPolicy: core.RetryPolicyFunc(func(int, error) time.Duration { return 10 * time.Millisecond }),
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		client.Stop(stopCtx) //nolint:errcheck // the test is over
	})

	for i := range 12 {
		f.enqueue(welcomeArgs{User: i}, &core.EnqueueOpts{Queue: "mail"})
	}
	f.dead = f.enqueue(receiptArgs{To: "bob@example.com"}, &core.EnqueueOpts{Queue: "mail", MaxAttempts: 3,
		Metadata: map[string]any{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01", "order": "A-1001"}})
	testdb.WaitFor(t, "the receipt job to die and the welcomes to succeed", func() bool {
		return testdb.Count(t, f.pool, `SELECT count(*) FROM relay_jobs WHERE queue = 'mail' AND state IN ('succeeded', 'dead')`) == 13 &&
			f.state(f.dead) == "dead"
	})

	// Queue billing has no worker: jobs queued, one for later, one running
	// (as a worker elsewhere left it), one cancelled, and a dead head that
	// blocks its ordering key.
	f.enqueue(plainArgs{"invoice.create"}, &core.EnqueueOpts{Queue: "billing"})
	f.enqueue(plainArgs{"invoice.create"}, &core.EnqueueOpts{Queue: "billing"})
	f.enqueue(plainArgs{"invoice.remind"}, &core.EnqueueOpts{Queue: "billing", Delay: time.Hour})
	running := f.enqueue(plainArgs{"invoice.render"}, &core.EnqueueOpts{Queue: "billing"})
	f.exec(`UPDATE relay_jobs SET state = 'claimed', attempt = 1, attempted_at = now(), attempted_by = 'host-7/worker-3',
		lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour' WHERE id = $1`, running)
	cancelled := f.enqueue(plainArgs{"invoice.void"}, &core.EnqueueOpts{Queue: "billing"})
	if err := core.Cancel(ctx, f.pool, cancelled); err != nil {
		t.Fatal(err)
	}
	f.dead2 = f.enqueue(plainArgs{"ledger.post"}, &core.EnqueueOpts{Queue: "billing", OrderingKey: "account-17", MaxAttempts: 1})
	f.enqueue(plainArgs{"ledger.post"}, &core.EnqueueOpts{Queue: "billing", OrderingKey: "account-17"})
	f.exec(`UPDATE relay_jobs SET state = 'claimed', attempt = 1, attempted_at = now(), attempted_by = 'host-7/worker-1',
		lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute' WHERE id = $1`, f.dead2)
	f.exec(`UPDATE relay_jobs SET state = 'dead', lease_token = NULL, lease_expires_at = NULL, finalized_at = now(),
		last_error = 'ledger: account 17 is frozen', history = jsonb_build_array(jsonb_build_object('attempt', 1,
		'started_at', attempted_at, 'finished_at', now(), 'error', 'ledger: account 17 is frozen', 'worker', 'host-7/worker-1'))
		WHERE id = $1`, f.dead2)

	// Queue reports is paused.
	if _, err := core.PauseQueue(ctx, f.pool, "reports", "alice@example.com"); err != nil {
		t.Fatal(err)
	}
	f.enqueue(plainArgs{"report.build"}, &core.EnqueueOpts{Queue: "reports"})

	// A schedule, fired once; outbox events, one dispatched.
	sch, err := scheduler.New(f.pool, &scheduler.Config{Schedules: []scheduler.Schedule{
		{Name: "nightly-digest", Spec: "0 3 * * *", TimeZone: "Europe/Paris", Args: plainArgs{"digest.build"}, Opts: &core.EnqueueOpts{Queue: "reports"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := scheduler.TriggerNow(ctx, f.pool, "nightly-digest"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		id, err := outbox.Publish(ctx, f.pool, outbox.Event{Topic: "order.paid", Key: "order-" + strconv.Itoa(i), Payload: map[string]int{"order": i}})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			f.exec(`UPDATE relay_outbox SET dispatched_at = now(), jobs = 1 WHERE id = $1`, id)
		}
	}
	return f
}

func (f *fixture) token(sub string, scopes ...string) string {
	f.t.Helper()
	tok, err := admin.MintToken(secret, admin.TokenOpts{Issuer: issuer, Audience: audience, Subject: sub, Scopes: scopes, TTL: time.Hour})
	if err != nil {
		f.t.Fatal(err)
	}
	return tok
}

func (f *fixture) enqueue(args core.JobArgs, o *core.EnqueueOpts) int64 {
	f.t.Helper()
	r, err := core.Enqueue(f.ctx, f.pool, args, o)
	if err != nil {
		f.t.Fatal(err)
	}
	return r.ID
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) state(id int64) string {
	f.t.Helper()
	j, err := core.JobGet(f.ctx, f.pool, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return string(j.State)
}

// signIn opens the dashboard and pastes tok.
func (f *fixture) signIn(t *testing.T, ctx context.Context, tok string) {
	t.Helper()
	browsertest.Run(t, ctx, "sign in",
		chromedp.EmulateViewport(1280, 800),
		chromedp.Navigate(f.url),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), tok),
		chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("#nav")),
	)
}

func count(t *testing.T, ctx context.Context, selector string) int {
	t.Helper()
	return browsertest.Value(t, ctx, "count "+selector, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", selector)))
}

func text(t *testing.T, ctx context.Context, selector string) string {
	t.Helper()
	browsertest.Run(t, ctx, "wait for "+selector, chromedp.WaitVisible(chromedp.CSS(selector)))
	return browsertest.Value(t, ctx, "read "+selector, chromedp.Text(chromedp.CSS(selector)))
}

// TestDashboard drives the dashboard in headless Chromium: an operator
// signs in, reads the overview, finds the dead job by filter, opens it,
// requeues it and sees it succeed; pauses and resumes a queue; sees the
// problem of a refused write; a read-only token sees no write button; a
// bad token is refused with the API's problem.
func TestDashboard(t *testing.T) {
	t.Logf("chromium: %s", browsertest.Chromium(t))
	f := setup(t)
	bctx := browsertest.New(t)

	t.Run("operator", func(t *testing.T) {
		ctx := browsertest.Tab(t, bctx)
		f.signIn(t, ctx, f.rw)
		// Overview: two dead jobs, queues listed, reports paused.
		browsertest.Run(t, ctx, "overview",
			chromedp.WaitVisible(chromedp.CSS(`button[data-queue="billing"]`)),
			browsertest.Screenshot(f.shots, "overview"))
		if got := text(t, ctx, "#card-dead .n"); got != "2" {
			t.Fatalf("dead jobs card says %q, want 2", got)
		}
		if got := text(t, ctx, "#who-mode"); got != "read + write" {
			t.Fatalf("who mode %q", got)
		}
		if n := count(t, ctx, `button[data-queue="reports"][data-queue-action="resume"]`); n != 1 {
			t.Fatal("paused queue reports has no Resume button")
		}

		// The outbox page: events, and the key blocked by a dead head, linked.
		browsertest.Run(t, ctx, "outbox",
			chromedp.Click(chromedp.CSS(`a[data-nav="outbox"]`)),
			chromedp.WaitVisible(chromedp.CSS(`button[data-redispatch]`)),
			chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`a[data-blocked-head="%d"]`, f.dead2))),
			browsertest.Screenshot(f.shots, "outbox"),
			chromedp.Click(chromedp.CSS(`a[data-nav="overview"]`)),
			chromedp.WaitVisible(chromedp.CSS(`button[data-queue="billing"]`)))

		// Pause and resume queue billing.
		browsertest.Run(t, ctx, "pause billing",
			chromedp.Click(chromedp.CSS(`button[data-queue="billing"][data-queue-action="pause"]`)),
			chromedp.WaitVisible(chromedp.CSS(`button[data-queue="billing"][data-queue-action="resume"]`)))
		if s := f.queuePaused("billing"); !s {
			t.Fatal("billing not paused in the database")
		}
		browsertest.Run(t, ctx, "resume billing",
			chromedp.Click(chromedp.CSS(`button[data-queue="billing"][data-queue-action="resume"]`)),
			chromedp.WaitVisible(chromedp.CSS(`button[data-queue="billing"][data-queue-action="pause"]`)))
		if s := f.queuePaused("billing"); s {
			t.Fatal("billing still paused in the database")
		}

		// Keyset paging: pages of 5 of the 12 succeeded welcome jobs, each
		// older than the last.
		const idsJS = `[...document.querySelectorAll("a[data-job-id]")].map(a => a.dataset.jobId).join(",")`
		nextPage := func(prev string) string { // click Next and wait for other rows
			browsertest.Run(t, ctx, "next page", chromedp.Click(chromedp.CSS("#next-page")))
			return browsertest.Value(t, ctx, "the next page's rows", chromedp.Poll[string](
				fmt.Sprintf(`document.querySelector("main[data-route]") && (ids => ids !== %q && ids)(%s)`, prev, idsJS)))
		}
		browsertest.Run(t, ctx, "first page",
			chromedp.Navigate(f.url+"#/jobs?kind=welcome.send&limit=5"),
			at("#/jobs?kind=welcome.send&limit=5"))
		first := browsertest.Value(t, ctx, "ids", chromedp.Evaluate[string](idsJS))
		second := nextPage(first)
		third := nextPage(second)
		if n := count(t, ctx, "#next-page"); n != 0 {
			t.Fatal("the last page has a Next link")
		}
		if len(strings.Split(first, ",")) != 5 || len(strings.Split(second, ",")) != 5 || len(strings.Split(third, ",")) != 2 {
			t.Fatalf("pages %q %q %q, want 5, 5 and 2 jobs", first, second, third)
		}
		if last, next := lastID(first), firstID(second); last <= next {
			t.Fatalf("page 2 starts at %d, not below page 1's last %d", next, last)
		}

		// Jobs: filter dead jobs of queue mail; one row, the receipt job.
		deadSel := fmt.Sprintf(`a[data-job-id="%d"]`, f.dead)
		browsertest.Run(t, ctx, "filter jobs",
			chromedp.Click(chromedp.CSS(`a[data-nav="jobs"]`)),
			at("#/jobs"),
			chromedp.SetValue(chromedp.CSS("#f-state"), "dead"),
			chromedp.SendKeys(chromedp.CSS("#f-queue"), "mail"),
			chromedp.Click(chromedp.CSS("#apply-filter")),
			at("#/jobs?state=dead&queue=mail"),
			browsertest.Screenshot(f.shots, "jobs"))
		if n := count(t, ctx, "a[data-job-id]"); n != 1 {
			t.Fatalf("%d jobs listed for state=dead queue=mail, want 1", n)
		}

		// The job page: three failed attempts, collapsed; the error; the
		// trace link.
		browsertest.Run(t, ctx, "open the dead job",
			chromedp.Click(chromedp.CSS(deadSel)),
			chromedp.WaitVisible(chromedp.CSS(`#job-state[data-job-state="dead"]`)),
			chromedp.WaitVisible(chromedp.CSS("#job-requeue")))
		if n := count(t, ctx, "details.attempt"); n != 3 {
			t.Fatalf("%d attempts shown, want 3", n)
		}
		if n := count(t, ctx, "details.attempt[open]"); n != 0 {
			t.Fatalf("%d attempts open, want all collapsed", n)
		}
		if e := text(t, ctx, "#last-error"); !strings.Contains(e, "550 mailbox unavailable") || !strings.Contains(e, "goroutine 42") {
			t.Fatalf("error shown: %q", e)
		}
		href := browsertest.Value(t, ctx, "trace link", chromedp.AttributeValue(chromedp.CSS("#trace-link"), "href")).Value
		if href != "http://tracing.invalid/trace/"+traceID {
			t.Fatalf("trace link %q", href)
		}
		browsertest.Run(t, ctx, "open an attempt",
			chromedp.Click(chromedp.CSS(`details.attempt[data-attempt="3"] summary`)),
			chromedp.WaitVisible(chromedp.CSS(`details.attempt[data-attempt="3"] pre`)),
			browsertest.Screenshot(f.shots, "job-dead"))

		// Requeue it with the worker fixed: the page follows it to succeeded.
		f.fixed.Store(true)
		browsertest.Run(t, ctx, "requeue and see it succeed",
			chromedp.Click(chromedp.CSS("#job-requeue")),
			chromedp.WaitVisible(chromedp.CSS(`#job-state[data-job-state="succeeded"]`)),
			browsertest.Screenshot(f.shots, "job-succeeded"))
		if s := f.state(f.dead); s != "succeeded" {
			t.Fatalf("job %d is %s in the database", f.dead, s)
		}

		// A refused write shows the API's problem: the other dead job's
		// page, requeued behind its back, then Requeue clicked (409).
		browsertest.Run(t, ctx, "open the second dead job",
			chromedp.Navigate(f.url+"#/jobs/"+strconv.FormatInt(f.dead2, 10)),
			chromedp.WaitVisible(chromedp.CSS(`#job-state[data-job-state="dead"]`)))
		if err := core.Requeue(f.ctx, f.pool, f.dead2); err != nil {
			t.Fatal(err)
		}
		browsertest.Run(t, ctx, "refused requeue",
			chromedp.Click(chromedp.CSS("#job-requeue")),
			chromedp.WaitVisible(chromedp.CSS(`[role=alert][data-problem-status="409"]`)))
		if d := text(t, ctx, "[role=alert] .problem-detail"); !strings.Contains(d, "jobs.requeue refused for job "+strconv.FormatInt(f.dead2, 10)) {
			t.Fatalf("problem detail %q", d)
		}

		// Bulk: the dry run's count first, then the change; a state the
		// action does not apply to is refused (422) with its field error.
		browsertest.Run(t, ctx, "bulk dry run",
			chromedp.Navigate(f.url+"#/jobs?state=cancelled"),
			at("#/jobs?state=cancelled"),
			chromedp.SetValue(chromedp.CSS("#bulk-action"), "requeue"),
			chromedp.Click(chromedp.CSS("#bulk-count")),
			chromedp.WaitVisible(chromedp.CSS("#bulk-confirm")),
			browsertest.Screenshot(f.shots, "bulk-confirm"))
		if q := text(t, ctx, "#bulk-q"); !strings.Contains(q, "1 job would be requeued") {
			t.Fatalf("dry run says %q", q)
		}
		browsertest.Run(t, ctx, "bulk confirm",
			chromedp.Click(chromedp.CSS("#bulk-confirm")),
			chromedp.WaitVisible(chromedp.CSS(`[role=status]`)))
		if n := testdb.Count(t, f.pool, `SELECT count(*) FROM relay_jobs WHERE state = 'cancelled'`); n != 0 {
			t.Fatalf("%d cancelled jobs left after the bulk requeue", n)
		}
		browsertest.Run(t, ctx, "bulk refused",
			chromedp.Navigate(f.url+"#/jobs?state=succeeded"),
			at("#/jobs?state=succeeded"),
			chromedp.SetValue(chromedp.CSS("#bulk-action"), "requeue"),
			chromedp.Click(chromedp.CSS("#bulk-count")),
			chromedp.WaitVisible(chromedp.CSS(`[role=alert][data-problem-status="422"]`)),
			browsertest.Screenshot(f.shots, "problem"))
		if p := text(t, ctx, "[role=alert]"); !strings.Contains(p, "requeue applies to jobs in states dead, cancelled") {
			t.Fatalf("problem shown: %q", p)
		}

		// Schedules and outbox.
		browsertest.Run(t, ctx, "schedules",
			chromedp.Click(chromedp.CSS(`a[data-nav="schedules"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#sched-nightly-digest button[data-schedule-action="pause"]`)),
			browsertest.Screenshot(f.shots, "schedules"))
		if n := count(t, ctx, "#sched-nightly-digest .next-fires li"); n != 5 {
			t.Fatalf("%d next fires shown, want 5", n)
		}
		browsertest.Run(t, ctx, "pause the schedule",
			chromedp.Click(chromedp.CSS(`#sched-nightly-digest button[data-schedule-action="pause"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#sched-nightly-digest button[data-schedule-action="resume"]`)))
		if !f.schedulePaused("nightly-digest") {
			t.Fatal("schedule not paused in the database")
		}
		browsertest.Run(t, ctx, "trigger the schedule",
			chromedp.Click(chromedp.CSS(`#sched-nightly-digest button[data-schedule-action="trigger"]`)),
			chromedp.WaitVisible(chromedp.CSS(`[role=status] a[href^="#/jobs/"]`)),
			// The note comes before the list's reload: wait for the
			// reloaded list (the fixture's trigger and this one), or the
			// backfill below may type into an input the reload replaces.
			chromedp.Poll[chromedp.Void](`document.querySelectorAll("#sched-nightly-digest .badge.outcome-triggered").length >= 2`))
		if n := testdb.Count(t, f.pool, `SELECT count(*) FROM relay_jobs WHERE kind = 'digest.build'`); n != 2 {
			t.Fatalf("%d digest.build jobs after a trigger, want 2", n)
		}
		// Backfill a past fire: a time that is not a fire time is the
		// API's problem; a fire time gets one job, however often asked.
		browsertest.Run(t, ctx, "backfill refused",
			chromedp.SetValue(chromedp.CSS("#sched-nightly-digest-backfill-at"), "2025-10-01T04:00:00+02:00"),
			chromedp.Click(chromedp.CSS(`#sched-nightly-digest button[data-schedule-action="backfill"]`)),
			chromedp.WaitVisible(chromedp.CSS(`[role=alert][data-problem-status="422"]`)))
		if p := text(t, ctx, "[role=alert]"); !strings.Contains(p, "not a fire time") {
			t.Fatalf("problem shown: %q", p)
		}
		browsertest.Run(t, ctx, "backfill a past fire",
			chromedp.SetValue(chromedp.CSS("#sched-nightly-digest-backfill-at"), "2025-10-01T03:00:00+02:00"),
			chromedp.Click(chromedp.CSS(`#sched-nightly-digest button[data-schedule-action="backfill"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#sched-nightly-digest .badge.outcome-backfilled`)),
			browsertest.Screenshot(f.shots, "schedule-backfilled"))
		browsertest.Run(t, ctx, "backfill it again",
			chromedp.SetValue(chromedp.CSS("#sched-nightly-digest-backfill-at"), "2025-10-01T01:00:00Z"),
			chromedp.Click(chromedp.CSS(`#sched-nightly-digest button[data-schedule-action="backfill"]`)),
			chromedp.Poll[chromedp.Void](`(document.querySelector("[role=status]")?.textContent || "").includes("had already enqueued")`))
		if n := testdb.Count(t, f.pool, `SELECT count(*) FROM relay_jobs WHERE kind = 'digest.build'`); n != 3 {
			t.Fatalf("%d digest.build jobs after two backfills of one fire, want 3", n)
		}

		// Redispatch the dispatched outbox event.
		browsertest.Run(t, ctx, "redispatch",
			chromedp.Click(chromedp.CSS(`a[data-nav="outbox"]`)),
			at("#/outbox"),
			chromedp.Click(chromedp.CSS(`button[data-redispatch]`)),
			chromedp.WaitVisible(chromedp.CSS(`[role=status]`)))
		if n := testdb.Count(t, f.pool, `SELECT count(*) FROM relay_outbox WHERE dispatched_at IS NULL`); n != 3 {
			t.Fatalf("%d pending events after the redispatch, want 3", n)
		}

		// Offline: everything this tab loaded came from the server itself.
		foreign := browsertest.Value(t, ctx, "resources", chromedp.Evaluate[[]string](
			`performance.getEntriesByType("resource").map(e => e.name).filter(u => !u.startsWith(location.origin + "/"))`))
		if len(foreign) != 0 {
			t.Fatalf("the dashboard loaded from other origins: %v", foreign)
		}
		if n := browsertest.Value(t, ctx, "resources", chromedp.Evaluate[int](`performance.getEntriesByType("resource").length`)); n < 10 {
			t.Fatalf("only %d resources loaded: the check above saw too little", n)
		}

		// Narrow window: the overview and a job still work.
		browsertest.Run(t, ctx, "narrow",
			chromedp.EmulateViewport(420, 860),
			chromedp.Navigate(f.url+"#/"),
			chromedp.WaitVisible(chromedp.CSS(`button[data-queue="billing"]`)),
			browsertest.Screenshot(f.shots, "overview-narrow"),
			chromedp.Navigate(f.url+"#/jobs/"+strconv.FormatInt(f.dead, 10)),
			chromedp.WaitVisible(chromedp.CSS(`#job-state[data-job-state="succeeded"]`)),
			browsertest.Screenshot(f.shots, "job-narrow"))
	})

	t.Run("read-only", func(t *testing.T) {
		ctx := browsertest.Tab(t, bctx)
		f.signIn(t, ctx, f.ro)
		browsertest.Run(t, ctx, "overview", chromedp.WaitVisible(chromedp.CSS("#card-dead")), chromedp.WaitVisible(chromedp.CSS("table")))
		if got := text(t, ctx, "#who-mode"); got != "read only" {
			t.Fatalf("who mode %q", got)
		}
		check := func(page, ready string) {
			t.Helper()
			browsertest.Run(t, ctx, page, chromedp.Navigate(f.url+page), at(page), chromedp.WaitVisible(chromedp.CSS(ready)))
			// The filter form's Apply is the one button a reader has.
			if n := count(t, ctx, "main button:not(#apply-filter)"); n != 0 {
				html := browsertest.Value(t, ctx, "html", chromedp.OuterHTML(chromedp.CSS("main")))
				t.Fatalf("%s: %d buttons for a read-only token:\n%s", page, n, html)
			}
			// Accessible basics: every form control has a label, every
			// button and link a name, one h1.
			unnamed := browsertest.Value(t, ctx, "unnamed controls", chromedp.Evaluate[int](`
				[...document.querySelectorAll("input, select, textarea")].filter(e => !e.labels.length && !e.getAttribute("aria-label")).length +
				[...document.querySelectorAll("button, a")].filter(e => !e.textContent.trim() && !e.getAttribute("aria-label")).length +
				(document.querySelectorAll("main h1").length === 1 ? 0 : 100)`))
			if unnamed != 0 {
				t.Fatalf("%s: %d unlabelled controls or a missing h1", page, unnamed)
			}
		}
		check("#/", "table")
		check("#/jobs", "a[data-job-id]")
		check("#/jobs/"+strconv.FormatInt(f.dead2, 10), "#job-state")
		check("#/schedules", "#sched-nightly-digest")
		check("#/outbox", "table")
	})

	t.Run("keyboard", func(t *testing.T) {
		// Sign in, reach the dead jobs and open one with the keyboard only;
		// the focused element shows a focus ring.
		ctx := browsertest.Tab(t, bctx)
		browsertest.Run(t, ctx, "sign in by keyboard",
			chromedp.EmulateViewport(1280, 800),
			chromedp.Navigate(f.url),
			chromedp.WaitVisible(chromedp.CSS("#token:focus")),
			chromedp.SendKeys(chromedp.CSS("#token"), f.ro),
			chromedp.KeyEvent("\t"),
			chromedp.WaitVisible(chromedp.CSS("#signin:focus")),
			chromedp.KeyEvent("\r"),
			chromedp.WaitVisible(chromedp.CSS("#card-dead")),
			chromedp.KeyEvent("\t"),
			chromedp.WaitVisible(chromedp.CSS("#card-dead a:focus")))
		outline := browsertest.Value(t, ctx, "focus ring", chromedp.Evaluate[string](
			`(s => s.outlineStyle + " " + s.outlineWidth)(getComputedStyle(document.activeElement))`))
		if outline != "solid 3px" {
			t.Fatalf("focused link's outline is %q, want solid 3px", outline)
		}
		browsertest.Run(t, ctx, "follow the link by keyboard",
			chromedp.KeyEvent("\r"),
			chromedp.WaitVisible(chromedp.CSS("#f-state")))
		if h := browsertest.Value(t, ctx, "hash", chromedp.Evaluate[string]("location.hash")); h != "#/jobs?state=dead" {
			t.Fatalf("Enter on the dead-jobs card went to %q", h)
		}
	})

	t.Run("login link", func(t *testing.T) {
		ctx := browsertest.Tab(t, bctx)
		code := f.login.NewCode(time.Minute)
		browsertest.Run(t, ctx, "open the login link",
			chromedp.EmulateViewport(1280, 800),
			chromedp.Navigate(f.url+"#login="+code),
			chromedp.WaitVisible(chromedp.CSS("#card-dead")))
		if who := text(t, ctx, "#who-name"); who != "dashboard-login" {
			t.Fatalf("signed in as %q", who)
		}
		if loc := browsertest.Value(t, ctx, "location", chromedp.Evaluate[string]("location.href")); strings.Contains(loc, code) {
			t.Fatalf("the code stayed in the address bar: %s", loc)
		}
		// The code is spent: a second use (another tab) is refused.
		ctx2 := browsertest.Tab(t, bctx)
		browsertest.Run(t, ctx2, "reuse the login link",
			chromedp.Navigate(f.url+"#login="+code),
			chromedp.WaitVisible(chromedp.CSS(`[role=alert][data-problem-status="403"]`)),
			chromedp.WaitVisible(chromedp.CSS("#token")))
	})

	t.Run("bad token", func(t *testing.T) {
		ctx := browsertest.Tab(t, bctx)
		other, err := admin.MintToken([]byte("another-secret-another-secret-123"), admin.TokenOpts{Issuer: issuer, Audience: audience, Subject: "mallory"})
		if err != nil {
			t.Fatal(err)
		}
		browsertest.Run(t, ctx, "refused sign-in",
			chromedp.EmulateViewport(1280, 800),
			chromedp.Navigate(f.url),
			chromedp.WaitVisible(chromedp.CSS("#token")),
			chromedp.SendKeys(chromedp.CSS("#token"), other),
			chromedp.Click(chromedp.CSS("#signin")),
			chromedp.WaitVisible(chromedp.CSS(`[role=alert][data-problem-status="401"]`)),
			browsertest.Screenshot(f.shots, "signin-refused"))
		// Signed out, the header shows neither the session nor the sections.
		if vis := browsertest.Value(t, ctx, "header", chromedp.Evaluate[string](
			`["who", "nav"].map(id => getComputedStyle(document.getElementById(id)).display).join(" ")`)); vis != "none none" {
			t.Fatalf("the signed-out header's session and navigation display as %q", vis)
		}
		if d := text(t, ctx, "[role=alert] .problem-detail"); !strings.Contains(d, "invalid token") {
			t.Fatalf("problem detail %q", d)
		}
	})
}

func (f *fixture) schedulePaused(name string) bool {
	f.t.Helper()
	return testdb.Count(f.t, f.pool, `SELECT count(*) FROM relay_schedules WHERE name = $1 AND paused`, name) == 1
}

func (f *fixture) queuePaused(name string) bool {
	f.t.Helper()
	return testdb.Count(f.t, f.pool, `SELECT count(*) FROM relay_queue_pauses WHERE queue = $1`, name) == 1
}

// at waits until the dashboard has rendered the page of the hash route.
func at(hash string) chromedp.Action[chromedp.Void] {
	return chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`main[data-route=%q]`, hash)))
}

func firstID(ids string) int64 {
	n, _ := strconv.ParseInt(strings.Split(ids, ",")[0], 10, 64)
	return n
}

func lastID(ids string) int64 {
	p := strings.Split(ids, ",")
	n, _ := strconv.ParseInt(p[len(p)-1], 10, 64)
	return n
}
