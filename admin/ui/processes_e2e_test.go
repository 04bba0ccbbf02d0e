package ui_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/relayq/relay/testkit/browsertest"
	"github.com/relayq/relay/testkit/testdb"
)

// TestProcessesAndUnservedQueues drives the dashboard in headless Chromium:
// the overview warns that no live process serves queue billing (runnable
// jobs, no worker), not about reports (paused) nor mail (served), and its
// Runnable card leaves the paused queue out; the Processes page lists the
// fixture's worker with its queue and slots, and the scheduler beside it.
func TestProcessesAndUnservedQueues(t *testing.T) {
	t.Logf("chromium: %s", browsertest.Chromium(t))
	f := setup(t)
	ctx := browsertest.Tab(t, browsertest.New(t))
	f.signIn(t, ctx, f.ro)

	browsertest.Run(t, ctx, "overview",
		chromedp.WaitVisible(chromedp.CSS(`[data-unserved-queue="billing"]`)),
		browsertest.Screenshot(f.shots, "dashboard-overview-unserved"))
	if got, want := text(t, ctx, `[data-unserved-queue="billing"]`), "No live process serves queue billing"; !strings.HasPrefix(got, want) {
		t.Errorf("warning %q; want it to start %q", got, want)
	}
	if n := count(t, ctx, `[data-unserved-queue]`); n != 1 {
		t.Errorf("%d unserved-queue warnings; want billing's alone (reports is paused, mail is served)", n)
	}
	runnable := testdb.Count(t, f.pool, `SELECT count(*) FROM relay_jobs WHERE state = 'queued' AND run_at <= now()
		AND queue NOT IN (SELECT queue FROM relay_queue_pauses)`)
	paused := testdb.Count(t, f.pool, `SELECT count(*) FROM relay_jobs WHERE state = 'queued' AND run_at <= now() AND queue = 'reports'`)
	if got := text(t, ctx, "#card-runnable .n"); got != strconv.Itoa(runnable) || paused == 0 {
		t.Errorf("Runnable card says %s; want %d (the paused queue's %d left out)", got, runnable, paused)
	}

	browsertest.Run(t, ctx, "processes",
		chromedp.Click(chromedp.CSS(`a[data-nav="processes"]`)),
		at("#/processes"),
		chromedp.WaitVisible(chromedp.CSS(`td[data-process-role="worker"]`)),
		browsertest.Screenshot(f.shots, "dashboard-processes"))
	if n := count(t, ctx, `td[data-process-role="worker"]`); n != 1 {
		t.Errorf("%d worker rows; want the fixture's client", n)
	}
	if n := count(t, ctx, `td[data-process-role="scheduler"]`); n != 1 {
		t.Errorf("%d scheduler rows; want the fixture's scheduler", n)
	}
	if got := text(t, ctx, "td.queues a"); got != "mail" {
		t.Errorf("the worker's queue link says %q; want mail", got)
	}
	row := browsertest.Value(t, ctx, "the worker's row", chromedp.Evaluate[string](
		`document.querySelector('td[data-process-role="worker"]').parentElement.textContent`))
	if want := fmt.Sprintf(":%d", os.Getpid()); !strings.Contains(row, "mail (2)") || !strings.Contains(row, want) {
		t.Errorf("worker row %q; want mail (2) and this process's pid %s", row, want)
	}
}
