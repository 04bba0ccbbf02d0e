package ui_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/testkit/browsertest"
	"github.com/relayq/relay/workflow"
)

// TestDashboardReadsRight drives the dashboard in headless Chromium in a
// viewer's zone of its own (Asia/Kolkata, UTC+05:30) and checks what an
// operator reads: the jobs' tags filter and tag links; every time
// labelled with its zone, a 03:00 Europe/Paris schedule's next fires all
// in one format, in Paris time and the viewer's; a queue whose failures are
// 2 % of its finishes shows them as bars at least 3 px tall; the outbox
// shows an event's delivery failure and a blocked key the outbox made by
// its event key, never in the internal kind||key form; no page overflows
// sideways at 1400 px and the overview keeps its key columns in view at
// 400 px; a run whose stored attempt log has an entry without times
// draws its time axis from the run's own times, not from 0001-01-01.
// Screenshots of each go to $RELAY_UI_SCREENSHOTS (docs/img holds them).
func TestDashboardReadsRight(t *testing.T) {
	t.Logf("chromium: %s", browsertest.Chromium(t))
	f := setup(t)
	shots := os.Getenv("RELAY_UI_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}

	// Tagged jobs on a queue without workers.
	f.enqueue(plainArgs{"tenant.sync"}, &core.EnqueueOpts{Queue: "tenants", Tags: []string{"tenant:acme"}})
	f.enqueue(plainArgs{"tenant.sync"}, &core.EnqueueOpts{Queue: "tenants", Tags: []string{"tenant:acme", "vip"}})
	f.enqueue(plainArgs{"tenant.sync"}, &core.EnqueueOpts{Queue: "tenants", Tags: []string{"tenant:globex"}})
	// A job whose kind, queue, ordering key and error are long words.
	long := f.enqueue(plainArgs{strings.Repeat("very.long.kind.", 16)}, &core.EnqueueOpts{Queue: strings.Repeat("q", 120),
		OrderingKey: strings.Repeat("customer-", 40), Tags: []string{strings.Repeat("t", 200)},
		Metadata: map[string]any{"note": strings.Repeat("x", 400)}})
	f.exec(`UPDATE relay_jobs SET last_error = repeat('E', 3000) WHERE id = $1`, long)
	// Queue stats finished 100 jobs this minute, 2 of them dead.
	f.exec(`INSERT INTO relay_jobs (kind, queue, args) SELECT 'stat.job', 'stats', jsonb_build_object('n', g) FROM generate_series(1, 100) AS g`)
	f.exec(`UPDATE relay_jobs SET state = 'claimed', attempt = 1, attempted_at = now(), attempted_by = 'w',
		lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute' WHERE queue = 'stats'`)
	f.exec(`UPDATE relay_jobs SET state = CASE WHEN (args->>'n')::int <= 2 THEN 'dead' ELSE 'succeeded' END,
		lease_token = NULL, lease_expires_at = NULL, finalized_at = now(),
		last_error = CASE WHEN (args->>'n')::int <= 2 THEN 'boom' END WHERE queue = 'stats'`)
	// An event the dispatcher set aside, and an ordering key the outbox
	// made (kind||key) blocked by a dead head.
	bad, err := outbox.Publish(f.ctx, f.pool, outbox.Event{Topic: "order.refunded", Key: "order-5", Payload: map[string]int{"order": 5}})
	if err != nil {
		t.Fatal(err)
	}
	f.exec(`UPDATE relay_outbox SET dispatched_at = now(), jobs = 0, failed_at = now(),
		dispatch_error = 'decode headers: json: cannot unmarshal number into a string' WHERE id = $1`, bad)
	head := f.enqueue(plainArgs{"ledger.credit"}, &core.EnqueueOpts{Queue: "ledger", OrderingKey: "ledger.credit||order-9", MaxAttempts: 1})
	f.enqueue(plainArgs{"ledger.credit"}, &core.EnqueueOpts{Queue: "ledger", OrderingKey: "ledger.credit||order-9"})
	f.exec(`UPDATE relay_jobs SET state = 'claimed', attempt = 1, attempted_at = now(), attempted_by = 'w',
		lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute' WHERE id = $1`, head)
	f.exec(`UPDATE relay_jobs SET state = 'dead', lease_token = NULL, lease_expires_at = NULL, finalized_at = now(),
		last_error = 'ledger closed' WHERE id = $1`, head)
	// A run (no worker runs it) with a step whose stored attempt log has an
	// entry without times.
	reg := workflow.NewRegistry(f.pool, nil)
	wf := workflow.MustRegister(reg, "zero.axis", func(wctx workflow.Context, in string) (string, error) { return in, nil })
	if _, err := workflow.Start(f.ctx, f.pool, wf, "x", &workflow.StartOpts{ID: "zero-axis-1"}); err != nil {
		t.Fatal(err)
	}
	f.exec(`INSERT INTO relay_workflow_steps (run_id, position, key, kind, state, attempts, output, finished_at, attempt_log)
		VALUES ('zero-axis-1', 0, 'charge', 'step', 'completed', 1, '1', now(), '[{"attempt": 1}]')`)

	tab := browsertest.Tab(t, browsertest.New(t))
	browsertest.Run(t, tab, "the viewer's zone",
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, emulation.SetTimezoneOverride, emulation.SetTimezoneOverrideParams{TimezoneID: "Asia/Kolkata"})
			return err
		}))
	f.signIn(t, tab, f.rw)
	browsertest.Run(t, tab, "1400 px", chromedp.EmulateViewport(1400, 900))

	// No page is wider than the window at 1400 px.
	for _, hash := range []string{"#/", "#/jobs", "#/jobs?state=dead", fmt.Sprintf("#/jobs/%d", f.dead), fmt.Sprintf("#/jobs/%d", long), "#/workflows",
		"#/workflows/run/zero-axis-1", "#/schedules", "#/outbox", "#/processes"} {
		browsertest.Run(t, tab, "open "+hash, chromedp.Navigate(f.url+hash), at(hash))
		w := browsertest.Value(t, tab, "widths", chromedp.Evaluate[[]int](
			`[document.documentElement.scrollWidth, document.documentElement.clientWidth]`))
		if w[0] > w[1] {
			wide := browsertest.Value(t, tab, "what is wide", chromedp.Evaluate[string](
				`[...document.querySelectorAll('main *')].filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth)
				  .slice(0, 5).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right)).join('; ')`))
			t.Errorf("%s is %d px wide in a %d px window: %s", hash, w[0], w[1], wide)
		}
	}

	// Overview: the 2 % of failures are bars an operator sees.
	browsertest.Run(t, tab, "overview", chromedp.Navigate(f.url+"#/"), at("#/"),
		chromedp.WaitVisible(chromedp.CSS(`svg[data-queue-chart="stats"]`)),
		browsertest.Screenshot(shots, "dashboard-overview-failures"))
	hs := browsertest.Value(t, tab, "failed bars", chromedp.Evaluate[[]float64](
		`[...document.querySelectorAll('svg[data-queue-chart="stats"] rect.f')].map(r => r.getBoundingClientRect().height)`))
	ok := browsertest.Value(t, tab, "succeeded bars", chromedp.Evaluate[int](
		`document.querySelectorAll('svg[data-queue-chart="stats"] rect.s').length`))
	if len(hs) == 0 || ok == 0 {
		t.Fatalf("queue stats: %d failed bars, %d succeeded bars; want both", len(hs), ok)
	}
	for _, h := range hs {
		if h < 3 {
			t.Fatalf("a failed bar is %.1f px tall: an operator cannot see it", h)
		}
	}
	if label := browsertest.Value(t, tab, "chart label", chromedp.Evaluate[string](
		`document.querySelector('svg[data-queue-chart="stats"]').getAttribute('aria-label')`)); !strings.Contains(label, "2 failed") {
		t.Fatalf("chart label %q", label)
	}

	// Jobs: the tags filter, and each tag a link to its jobs; every time
	// labelled with the viewer's zone.
	const idsJS = `[...document.querySelectorAll("a[data-job-id]")].map(a => a.dataset.jobId).length`
	browsertest.Run(t, tab, "filter by tag",
		chromedp.Navigate(f.url+"#/jobs"), at("#/jobs"),
		chromedp.SendKeys(chromedp.CSS("#f-tag"), "tenant:acme"),
		chromedp.Click(chromedp.CSS("#apply-filter")),
		at("#/jobs?tag=tenant%3Aacme"),
		browsertest.Screenshot(shots, "dashboard-jobs-tags"))
	if n := browsertest.Value(t, tab, "rows", chromedp.Evaluate[int](idsJS)); n != 2 {
		t.Fatalf("tag tenant:acme lists %d jobs, want 2", n)
	}
	if got := text(t, tab, "main tbody time"); !regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d GMT\+5:30$`).MatchString(got) {
		t.Fatalf("a job's time reads %q, want it labelled with the viewer's zone (GMT+5:30)", got)
	}
	if z := text(t, tab, "#filter-zone"); !strings.Contains(z, "Asia/Kolkata") && !strings.Contains(z, "Asia/Calcutta") { // ICU may name it by its old name
		t.Fatalf("the filter's zone note reads %q", z)
	}
	browsertest.Run(t, tab, "a tag link", chromedp.Click(chromedp.CSS(`a[data-tag="vip"]`)), at("#/jobs?tag=vip"))
	if n := browsertest.Value(t, tab, "rows", chromedp.Evaluate[int](idsJS)); n != 1 {
		t.Fatalf("tag vip lists %d jobs, want 1", n)
	}
	browsertest.Run(t, tab, "two tags", chromedp.Navigate(f.url+"#/jobs?tag=tenant%3Aacme&tag=vip"), at("#/jobs?tag=tenant%3Aacme&tag=vip"))
	if v := browsertest.Value(t, tab, "the tags field", chromedp.Evaluate[string](`document.querySelector("#f-tag").value`)); v != "tenant:acme, vip" {
		t.Fatalf("the tags field reads %q", v)
	}

	// Schedules: 03:00 in Paris is 07:30 in Kolkata in December; every
	// next fire reads the same way, in both zones.
	browsertest.Run(t, tab, "schedules", chromedp.Navigate(f.url+"#/schedules"), at("#/schedules"),
		chromedp.WaitVisible(chromedp.CSS(".next-fires li")),
		browsertest.Screenshot(shots, "dashboard-schedules-zones"))
	fires := browsertest.Value(t, tab, "next fires", chromedp.Evaluate[[]string](
		`[...document.querySelectorAll('.next-fires li')].map(li => li.textContent)`))
	want := regexp.MustCompile(`^\d{4}-\d\d-\d\d 03:00:00 Europe/Paris · 07:30:00 GMT\+5:30 your time$`)
	if len(fires) != 5 {
		t.Fatalf("%d next fires, want 5", len(fires))
	}
	for _, fire := range fires {
		if !want.MatchString(fire) {
			t.Fatalf("a next fire reads %q, want %s", fire, want)
		}
	}

	// Outbox: the event's delivery failure; the blocked key by its event
	// key and subscriber; no kind||key anywhere.
	browsertest.Run(t, tab, "outbox", chromedp.Navigate(f.url+"#/outbox"), at("#/outbox"),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`[data-delivery-error="%d"]`, bad))),
		browsertest.Screenshot(shots, "dashboard-outbox-delivery"))
	if e := text(t, tab, fmt.Sprintf(`[data-delivery-error="%d"]`, bad)); !strings.Contains(e, "not delivered") || !strings.Contains(e, "decode headers") {
		t.Fatalf("the failed event's delivery reads %q", e)
	}
	if k := text(t, tab, `[data-blocked-key="ledger.credit||order-9"]`); !strings.Contains(k, "order-9") || !strings.Contains(k, "ledger.credit") || strings.Contains(k, "||") {
		t.Fatalf("the outbox's blocked key reads %q", k)
	}
	if body := text(t, tab, "main"); strings.Contains(body, "||") {
		t.Fatalf("the outbox page shows an internal kind||key form:\n%s", body)
	}

	// The run's time axis starts at its own times.
	browsertest.Run(t, tab, "run", chromedp.Navigate(f.url+"#/workflows/run/zero-axis-1"), at("#/workflows/run/zero-axis-1"),
		chromedp.WaitVisible(chromedp.CSS("#timeline")))
	from := browsertest.Value(t, tab, "axis start", chromedp.Evaluate[string](
		`document.querySelector('#timeline').previousElementSibling.querySelector('time').getAttribute('datetime')`))
	if !strings.HasPrefix(from, "20") {
		t.Fatalf("the run's time axis starts at %s", from)
	}

	// 400 px: the overview's queue, runnable, running and dead columns are
	// in view without scrolling, and nothing overflows the window.
	browsertest.Run(t, tab, "400 px", chromedp.EmulateViewport(400, 860), chromedp.Navigate(f.url+"#/"), at("#/"),
		chromedp.WaitVisible(chromedp.CSS(`button[data-queue="billing"]`)))
	browsertest.Value(t, tab, "scroll to the queues", chromedp.Evaluate[bool](`document.querySelector('main table').scrollIntoView(), true`))
	browsertest.Run(t, tab, "screenshot", browsertest.Screenshot(shots, "dashboard-overview-400px"))
	cols := browsertest.Value(t, tab, "columns in view", chromedp.Evaluate[map[string][]int](
		`Object.fromEntries([...document.querySelectorAll('main table th')].map(th => {
		   const r = th.getBoundingClientRect();
		   return [th.textContent, [Math.round(r.left), Math.round(r.right), Math.round(r.width)]];
		 }))`))
	for _, c := range []string{"Queue", "Runnable", "Running", "Dead", "Actions"} {
		if r := cols[c]; len(r) != 3 || r[2] == 0 || r[0] < 0 || r[1] > 400 {
			t.Errorf("at 400 px the overview's %s column is out of view (left, right, width: %v): %v", c, r, cols)
		}
	}
	w := browsertest.Value(t, tab, "widths", chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, document.documentElement.clientWidth]`))
	if w[0] > w[1] {
		t.Errorf("the overview is %d px wide in a %d px window", w[0], w[1])
	}
}
