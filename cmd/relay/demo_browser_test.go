package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/relayq/relay/testkit/browsertest"
	"github.com/relayq/relay/testkit/testdb"
)

// TestDemoInTheDashboard opens what `relay demo` left through the login
// link of `relay demo --dashboard` in headless Chromium: the completed,
// compensated and waiting payment runs, the month-end schedule, the outbox
// events and the job traced across its retries. It saves a screenshot of
// each page in $RELAY_UI_SCREENSHOTS (docs/img holds them), else in a
// temporary directory.
func TestDemoInTheDashboard(t *testing.T) {
	browsertest.Chromium(t) // skip before building when there is no browser
	shots := os.Getenv("RELAY_UI_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	bin := buildRelay(t)
	pool := testdb.New(t)
	url := pool.Config().ConnString()
	if out, errOut, code := runRelay(t, bin, "demo", "--database-url", url); code != 0 {
		t.Fatalf("relay demo: exit %d\n%s\n%s", code, out, errOut)
	}
	ctx := context.Background()
	runs := map[string]string{} // state → run id
	rows, err := pool.Query(ctx, `SELECT state, id FROM relay_workflow_runs WHERE workflow = 'demo.payment'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var state, id string
		if err := rows.Scan(&state, &id); err != nil {
			t.Fatal(err)
		}
		runs[state] = id
	}
	rows.Close()
	var flaky int64
	if err := pool.QueryRow(ctx, `SELECT id FROM relay_jobs WHERE kind = 'demo.flaky'`).Scan(&flaky); err != nil {
		t.Fatal(err)
	}

	link := demoDashboard(t, bin, url)
	base := link[:strings.Index(link, "#")]
	tab := browsertest.Tab(t, browsertest.New(t))
	browsertest.Run(t, tab, "sign in and see the overview",
		chromedp.Navigate(link),
		chromedp.WaitVisible(chromedp.CSS(`button[data-queue="payments"]`)),
		browsertest.Screenshot(shots, "demo-overview"))
	browsertest.Run(t, tab, "the completed run",
		chromedp.Navigate(base+"#/workflows/run/"+runs["completed"]),
		chromedp.WaitVisible(chromedp.CSS(`#run-state[data-run-state="completed"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-step-key="email"]`)),
		browsertest.Screenshot(shots, "demo-run-completed"))
	browsertest.Run(t, tab, "the compensated run",
		chromedp.Navigate(base+"#/workflows/run/"+runs["compensated"]),
		chromedp.WaitVisible(chromedp.CSS(`#run-state[data-run-state="compensated"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-step-key="compensate:refund"]`)),
		browsertest.Screenshot(shots, "demo-run-compensated"))
	browsertest.Run(t, tab, "the waiting run",
		chromedp.Navigate(base+"#/workflows/run/"+runs["running"]),
		chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-step-key="signal:confirmed#1"][data-step-state="waiting"]`)),
		browsertest.Screenshot(shots, "demo-run-waiting"))
	browsertest.Run(t, tab, "the month-end schedule",
		chromedp.Click(chromedp.CSS(`a[data-nav="schedules"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#sched-month-end-settlement button[data-schedule-action="pause"]`)),
		browsertest.Screenshot(shots, "demo-schedules"))
	browsertest.Run(t, tab, "the outbox events",
		chromedp.Click(chromedp.CSS(`a[data-nav="outbox"]`)),
		chromedp.WaitVisible(chromedp.CSS(`button[data-redispatch]`)),
		browsertest.Screenshot(shots, "demo-outbox"))
	browsertest.Run(t, tab, "the job traced across its retries",
		chromedp.Navigate(base+"#/jobs/"+strconv.FormatInt(flaky, 10)),
		chromedp.WaitVisible(chromedp.CSS(`[data-job-state="succeeded"]`)),
		browsertest.Screenshot(shots, "demo-job-traced"))
	if n := browsertest.Value(t, tab, "the flaky job's trace", chromedp.Evaluate[bool](`document.body.innerText.includes("Trace")`)); !n {
		t.Error("the flaky job's page shows no trace")
	}
}
