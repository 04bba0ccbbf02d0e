package ui_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/relayq/relay/admin"
	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/browsertest"
	"github.com/relayq/relay/testkit/testdb"
	"github.com/relayq/relay/workflow"
)

// TestWorkflowRunPages drives the workflow pages in headless Chromium
// against running workflows: the overview's failed-runs card leads to the
// failed run; its step timeline shows the failed step after the completed
// one, each of its two failed attempts a red segment at its own times; Retry (with the step fixed) is seen to finish the run;
// a compensated run marks its compensation step; a run waiting for a signal
// is signalled from its page and finishes with the payload; a child run is
// nested and linked; a run waiting on a signal is terminated from its page
// with a reason (its compensation never runs); a read-only token sees no
// action.
func TestWorkflowRunPages(t *testing.T) {
	t.Logf("chromium: %s", browsertest.Chromium(t))
	ctx := context.Background()
	pool := testdb.New(t)
	shots := os.Getenv("RELAY_UI_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	h, err := admin.Handler(pool, &admin.Config{Auth: &admin.Auth{Issuer: issuer, Audience: audience, HS256Secret: secret}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/relay/", http.StripPrefix("/relay", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	base := srv.URL + "/relay/ui/"
	f := &fixture{t: t, ctx: ctx, pool: pool, url: base}
	rw := f.token("alice@example.com", admin.ScopeRead, admin.ScopeWrite)
	ro := f.token("reader@example.com", admin.ScopeRead)

	var broken atomic.Bool
	broken.Store(true)
	reg := workflow.NewRegistry(pool, &workflow.Config{
		ExecutionRetry: core.RetryPolicyFunc(func(int, error) time.Duration { return 0 }),
	})
	fast := &workflow.StepOpts{MaxAttempts: 2, Retry: core.RetryPolicyFunc(func(int, error) time.Duration { return 50 * time.Millisecond })}
	shout := workflow.MustRegister(reg, "shout", func(wctx workflow.Context, in string) (string, error) {
		return workflow.Step(wctx, "upper", func(context.Context) (string, error) { return strings.ToUpper(in), nil }, nil)
	})
	report := workflow.MustRegister(reg, "report", func(wctx workflow.Context, in string) (string, error) {
		rows, err := workflow.Step(wctx, "gather", func(context.Context) (int, error) { return 3, nil }, nil)
		if err != nil {
			return "", err
		}
		if err := workflow.Sleep(wctx, "cool-down", 300*time.Millisecond); err != nil {
			return "", err
		}
		return workflow.Step(wctx, "render", func(context.Context) (string, error) {
			if broken.Load() {
				return "", errors.New("renderer out of ink")
			}
			return fmt.Sprintf("%s: %d rows", in, rows), nil
		}, fast)
	})
	pay := workflow.MustRegister(reg, "pay", func(wctx workflow.Context, amount int) (string, error) {
		if _, err := workflow.Step(wctx, "reserve", func(context.Context) (int, error) { return amount, nil }, nil); err != nil {
			return "", err
		}
		workflow.Compensate(wctx, "release", func(context.Context) error { return nil })
		return workflow.Step(wctx, "charge", func(ctx context.Context) (string, error) {
			if err := workflow.Heartbeat(ctx, map[string]string{"card": "****4242"}); err != nil {
				return "", err
			}
			return "", errors.New("card declined")
		}, &workflow.StepOpts{MaxAttempts: 1})
	})
	approve := workflow.MustRegister(reg, "approve", func(wctx workflow.Context, in string) (string, error) {
		shouted, err := workflow.Child(wctx, "shout", shout, in, nil).Get(wctx)
		if err != nil {
			return "", err
		}
		d, _, err := workflow.WaitSignal[map[string]string](wctx, "decision", 0)
		if err != nil {
			return "", err
		}
		return shouted + " approved by " + d["by"], nil
	})
	var released atomic.Int32
	hold := workflow.MustRegister(reg, "hold", func(wctx workflow.Context, in string) (string, error) {
		if _, err := workflow.Step(wctx, "reserve", func(context.Context) (string, error) { return in, nil }, nil); err != nil {
			return "", err
		}
		workflow.Compensate(wctx, "release", func(context.Context) error { released.Add(1); return nil })
		_, _, err := workflow.WaitSignal[string](wctx, "never", 0)
		return in, err
	})
	ws := core.NewWorkers()
	if err := reg.AddWorkers(ws); err != nil {
		t.Fatal(err)
	}
	client, err := core.NewClient(pool, &core.Config{Workers: ws, PollInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 4}}, Logger: slog.New(slog.DiscardHandler)})
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
	for _, err := range []error{
		startRun(ctx, pool, report, "report-q3", "q3"),
		startRun(ctx, pool, pay, "pay-42", 42, "tenant:acme", "order:42"),
		startRun(ctx, pool, approve, "po-7", "po-7", "ship:1,2"),
		startRun(ctx, pool, hold, "hold-9", "seat-9"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	runState := func(id string) string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT state FROM relay_workflow_runs WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	testdb.WaitFor(t, "report-q3 to fail, pay-42 to compensate, po-7 and hold-9 to wait", func() bool {
		return runState("report-q3") == "failed" && runState("pay-42") == "compensated" &&
			testdb.Count(t, pool, `SELECT count(*) FROM relay_workflow_steps WHERE run_id IN ('po-7', 'hold-9') AND kind = 'signal'`) == 2
	})

	bctx := browsertest.New(t)
	t.Run("operator", func(t *testing.T) {
		tab := browsertest.Tab(t, bctx)
		f.signIn(t, tab, rw)
		// The overview's failed-runs card leads to the failed run.
		if got := text(t, tab, "#card-failed-runs .n"); got != "1" {
			t.Fatalf("failed runs card says %q, want 1", got)
		}
		browsertest.Run(t, tab, "failed runs",
			chromedp.Click(chromedp.CSS("#card-failed-runs a")),
			at("#/workflows?state=failed"),
			browsertest.Screenshot(shots, "workflow-runs"))
		if n := count(t, tab, "a[data-run-id]"); n != 1 {
			t.Fatalf("%d failed runs listed, want 1", n)
		}
		browsertest.Run(t, tab, "open the failed run",
			chromedp.Click(chromedp.CSS(`a[data-run-id="report-q3"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#run-state[data-run-state="failed"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-step-key="render"][data-step-state="failed"]`)),
			chromedp.Click(chromedp.CSS(`li[data-step-key="render"] summary`)),
			chromedp.WaitVisible(chromedp.CSS(`li[data-step-key="render"] pre.err-pre`)),
			browsertest.Screenshot(shots, "workflow-run-failed"))
		keys := browsertest.Value(t, tab, "timeline", chromedp.Evaluate[string](
			`[...document.querySelectorAll("#timeline > li")].map(li => li.dataset.stepKey + "=" + li.dataset.stepState).join(",")`))
		if keys != "gather=completed,cool-down=completed,render=failed" {
			t.Fatalf("timeline %q", keys)
		}
		// Each attempt is a segment of its own, from the step's attempt
		// log: the failed step's two failed attempts, in time order, and
		// gather's one.
		if n := count(t, tab, `li[data-step-key="render"] rect.attempt.att-failed`); n != 2 {
			t.Fatalf("%d failed attempt segments on the failed step, want 2", n)
		}
		if n := count(t, tab, `li[data-step-key="render"] rect.attempt.att-ok, li[data-step-key="render"] line.tick`); n != 0 {
			t.Fatalf("%d succeeded segments or ticks on the failed step, want none", n)
		}
		if n := count(t, tab, `li[data-step-key="gather"] rect.attempt.att-ok`); n != 1 {
			t.Fatalf("%d succeeded attempt segments on gather, want 1", n)
		}
		apart := browsertest.Value(t, tab, "attempt segments", chromedp.Evaluate[bool](
			`(() => { const [a, b] = [...document.querySelectorAll('li[data-step-key="render"] rect.attempt')];
			  return a.dataset.attempt === "1" && b.dataset.attempt === "2" && +a.getAttribute("x") <= +b.getAttribute("x"); })()`))
		if !apart {
			t.Fatal("the failed step's attempt segments are not attempts 1 then 2, in time order")
		}
		if e := text(t, tab, `li[data-step-key="render"] ol.attempts li.att-failed[data-attempt="2"]`); !strings.Contains(e, "attempt 2: failed") || !strings.Contains(e, "out of ink") {
			t.Fatalf("attempt 2 in the step's detail: %q", e)
		}
		if n := count(t, tab, `li[data-step-key="cool-down"] rect.wait`); n != 1 {
			t.Fatal("the sleep is not drawn as a wait")
		}
		if e := text(t, tab, `li[data-step-key="render"] pre.err-pre`); !strings.Contains(e, "out of ink") {
			t.Fatalf("step error %q", e)
		}
		// Retry from the failed step, fixed: the page follows it to completed.
		broken.Store(false)
		browsertest.Run(t, tab, "retry and see it finish",
			chromedp.Click(chromedp.CSS("#run-retry")),
			chromedp.WaitVisible(chromedp.CSS(`#run-state[data-run-state="completed"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-step-key="render"][data-step-state="completed"]`)),
			browsertest.Screenshot(shots, "workflow-run-retried"))
		if s := runState("report-q3"); s != "completed" {
			t.Fatalf("report-q3 is %s in the database", s)
		}
		if n := count(t, tab, `li[data-step-key="render"] rect.attempt.att-ok`); n != 1 {
			t.Fatalf("%d succeeded attempt segments on the retried step, want 1", n)
		}

		// The compensated run: its compensation step is marked; it offers
		// no retry.
		browsertest.Run(t, tab, "compensated run",
			chromedp.Navigate(base+"#/workflows/run/pay-42"),
			chromedp.WaitVisible(chromedp.CSS(`#run-state[data-run-state="compensated"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#timeline li.comp[data-step-key="compensate:release"] .badge.comp`)),
			browsertest.Screenshot(shots, "workflow-run-compensated"))
		if n := count(t, tab, "#run-retry, #run-cancel, #signal-form, #terminate-form"); n != 0 {
			t.Fatal("a compensated run offers actions")
		}
		// The charge step's latest heartbeat: its attempt and its details.
		browsertest.Run(t, tab, "a step's heartbeat",
			chromedp.Click(chromedp.CSS(`#timeline li[data-step-key="charge"] summary`)),
			chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-step-key="charge"] [data-heartbeat-attempt="1"]`)),
			browsertest.Screenshot(shots, "workflow-run-heartbeat"))
		if d := text(t, tab, `#timeline li[data-step-key="charge"] [data-heartbeat-attempt="1"] + *`); !strings.Contains(d, "****4242") {
			t.Fatalf("the heartbeat's details shown %q", d)
		}

		// The waiting run: its child nested and linked; signalled from the
		// page, it finishes with the payload.
		browsertest.Run(t, tab, "waiting run",
			chromedp.Navigate(base+"#/workflows/run/po-7"),
			chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-step-key="signal:decision#1"][data-step-state="waiting"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-step-key="shout"] .nested a[data-child-run="po-7/shout"]`)),
			browsertest.Screenshot(shots, "workflow-run-waiting"))
		if v := browsertest.Value(t, tab, "signal name", chromedp.Evaluate[string](`document.querySelector("#signal-name").value`)); v != "decision" {
			t.Fatalf("signal name prefilled %q", v)
		}
		// A payload the run cannot decode into its wait's type: set
		// aside, listed with its decode error; the run waits on.
		browsertest.Run(t, tab, "a bad signal is set aside",
			chromedp.SetValue(chromedp.CSS("#signal-payload"), `[1, 2]`),
			chromedp.Click(chromedp.CSS("#signal-send")),
			chromedp.WaitVisible(chromedp.CSS(`[data-set-aside-signal="decision"]`)),
			browsertest.Screenshot(shots, "workflow-run-set-aside-signal"))
		if e := text(t, tab, `tr:has([data-set-aside-signal="decision"]) pre`); !strings.Contains(e, "map[string]string") {
			t.Fatalf("set-aside signal's error shown %q", e)
		}
		if s := runState("po-7"); s != "running" {
			t.Fatalf("po-7 is %s after a bad signal, want running", s)
		}
		browsertest.Run(t, tab, "signal and see it finish",
			chromedp.SetValue(chromedp.CSS("#signal-payload"), `{"by": "eve"}`),
			chromedp.Click(chromedp.CSS("#signal-send")),
			chromedp.WaitVisible(chromedp.CSS(`#run-state[data-run-state="completed"]`)))
		if out := text(t, tab, "main .cols section:last-child pre"); !strings.Contains(out, "PO-7 approved by eve") {
			t.Fatalf("output shown %q", out)
		}
		// The child's parent-close policy, in the child runs table.
		if p := text(t, tab, `tr:has(a[data-child-run="po-7/shout"]) [data-parent-close]`); p != "cancel" {
			t.Fatalf("the child's parent-close policy shown %q, want cancel (the default)", p)
		}
		browsertest.Run(t, tab, "the child run",
			chromedp.Click(chromedp.CSS(`table a[data-child-run="po-7/shout"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#run-state[data-run-state="completed"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#run-parent`)))
		if h := browsertest.Value(t, tab, "hash", chromedp.Evaluate[string]("location.hash")); h != "#/workflows/run/"+url.PathEscape("po-7/shout") {
			t.Fatalf("child run page at %q", h)
		}
		// Terminate from the run's page: a reason is required; the run
		// ends terminated with it, and its compensation never runs.
		browsertest.Run(t, tab, "terminate a waiting run",
			chromedp.Navigate(base+"#/workflows/run/hold-9"),
			chromedp.WaitVisible(chromedp.CSS(`#run-state[data-run-state="running"]`)),
			chromedp.WaitVisible(chromedp.CSS("#terminate-form")),
			chromedp.SetValue(chromedp.CSS("#terminate-reason"), "seat sold elsewhere"),
			browsertest.Screenshot(shots, "workflow-run-terminate"),
			chromedp.Click(chromedp.CSS("#run-terminate")),
			chromedp.WaitVisible(chromedp.CSS(`#run-state[data-run-state="terminated"]`)),
			browsertest.Screenshot(shots, "workflow-run-terminated"))
		if e := text(t, tab, "#run-error"); !strings.Contains(e, "seat sold elsewhere") {
			t.Fatalf("terminated run's error shown %q", e)
		}
		if s := runState("hold-9"); s != "terminated" {
			t.Fatalf("hold-9 is %s in the database", s)
		}
		if n := count(t, tab, "#run-cancel, #signal-form, #terminate-form"); n != 0 {
			t.Fatal("a terminated run offers actions")
		}
		if released.Load() != 0 || testdb.Count(t, pool, `SELECT count(*) FROM relay_admin_audit WHERE action = 'workflows.terminate'
			AND target->>'reason' = 'seat sold elsewhere'`) != 1 {
			t.Fatalf("compensation ran %d times, or the terminate was not audited with its reason", released.Load())
		}
		// Narrow window: the timeline stacks and still shows every step.
		browsertest.Run(t, tab, "narrow",
			chromedp.EmulateViewport(420, 860),
			chromedp.Navigate(base+"#/workflows/run/report-q3"),
			chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-step-key="render"] svg`)),
			browsertest.Screenshot(shots, "workflow-run-narrow"))
		if n := count(t, tab, "#timeline svg.gbar"); n != 3 {
			t.Fatalf("%d bars on the narrow timeline, want 3", n)
		}
	})

	// The runs page filters by tag (comma-separated: every tag), and a
	// run's tag links to the runs carrying it.
	t.Run("tags", func(t *testing.T) {
		tab := browsertest.Tab(t, bctx)
		f.signIn(t, tab, ro)
		browsertest.Run(t, tab, "filter by tags",
			chromedp.Navigate(base+"#/workflows"), at("#/workflows"),
			chromedp.SetValue(chromedp.CSS("#wf-tag"), "tenant:acme, order:42"),
			chromedp.Click(chromedp.CSS("#apply-filter")),
			at("#/workflows?tag=tenant%3Aacme%2C+order%3A42"),
			chromedp.WaitVisible(chromedp.CSS(`a[data-run-id="pay-42"]`)),
			browsertest.Screenshot(shots, "workflow-runs-by-tag"))
		if n := count(t, tab, "a[data-run-id]"); n != 1 {
			t.Fatalf("%d runs listed for tenant:acme and order:42, want pay-42 alone", n)
		}
		browsertest.Run(t, tab, "a tag's link",
			chromedp.Click(chromedp.CSS(`a.tag[href*="order%3A42"]`)),
			at("#/workflows?tag=order%3A42"),
			chromedp.WaitVisible(chromedp.CSS(`a[data-run-id="pay-42"]`)))
		// A tag holding a comma: its link quotes it, and so may the filter's
		// text; split on the comma, it would name two tags no run carries.
		browsertest.Run(t, tab, "a tag with a comma",
			chromedp.Navigate(base+"#/workflows"), at("#/workflows"),
			chromedp.Click(chromedp.CSS(`tr:has(a[data-run-id="po-7"]) a.tag`)),
			at("#/workflows?tag=%22ship%3A1%2C2%22"),
			chromedp.WaitVisible(chromedp.CSS(`a[data-run-id="po-7"]`)))
		if n := count(t, tab, "a[data-run-id]"); n != 1 {
			t.Fatalf("%d runs listed for the tag ship:1,2, want po-7 alone", n)
		}
		browsertest.Run(t, tab, "a quoted tag typed with another",
			chromedp.SetValue(chromedp.CSS("#wf-tag"), `"ship:1,2" , tenant:acme`),
			chromedp.Click(chromedp.CSS("#apply-filter")),
			at("#/workflows?tag=%22ship%3A1%2C2%22+%2C+tenant%3Aacme"))
		if n := count(t, tab, "a[data-run-id]"); n != 0 {
			t.Fatalf("%d runs listed for ship:1,2 and tenant:acme, which no run carries both", n)
		}
		browsertest.Run(t, tab, "a tag no run carries",
			chromedp.SetValue(chromedp.CSS("#wf-tag"), "tenant:nobody"),
			chromedp.Click(chromedp.CSS("#apply-filter")),
			at("#/workflows?tag=tenant%3Anobody"))
		if n := count(t, tab, "a[data-run-id]"); n != 0 {
			t.Fatalf("%d runs listed for a tag no run carries", n)
		}
	})

	t.Run("read-only", func(t *testing.T) {
		tab := browsertest.Tab(t, bctx)
		f.signIn(t, tab, ro)
		for page, ready := range map[string]string{
			"#/workflows":                 "a[data-run-id]",
			"#/workflows/run/report-q3":   "#timeline",
			"#/workflows/run/po-7":        "#timeline",
			"#/workflows?state=completed": "a[data-run-id]",
		} {
			browsertest.Run(t, tab, page, chromedp.Navigate(base+page), at(page), chromedp.WaitVisible(chromedp.CSS(ready)))
			if n := count(t, tab, "main button:not(#apply-filter), #signal-form, #terminate-form"); n != 0 {
				t.Fatalf("%s: %d actions for a read-only token", page, n)
			}
			unnamed := browsertest.Value(t, tab, "unnamed controls", chromedp.Evaluate[int](`
				[...document.querySelectorAll("input, select, textarea")].filter(e => !e.labels.length && !e.getAttribute("aria-label")).length +
				[...document.querySelectorAll("button, a")].filter(e => !e.textContent.trim() && !e.getAttribute("aria-label")).length +
				(document.querySelectorAll("main h1").length === 1 ? 0 : 100)`))
			if unnamed != 0 {
				t.Fatalf("%s: %d unlabelled controls or a missing h1", page, unnamed)
			}
		}
	})
}

func startRun[In, Out any](ctx context.Context, pool interface{ core.DB }, wf *workflow.Workflow[In, Out], id string, in In, tags ...string) error {
	_, err := workflow.Start(ctx, pool, wf, in, &workflow.StartOpts{ID: id, Tags: tags})
	return err
}
