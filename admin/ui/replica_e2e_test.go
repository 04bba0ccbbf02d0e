package ui_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/admin"
	"github.com/relayq/relay/core"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/browsertest"
	"github.com/relayq/relay/testkit/devpg"
)

// With lists read from a streaming standby, the dashboard's header shows
// the replica's lag: 0 once it has caught up, a lag while its replay is
// paused behind a write on the primary, and 0 again after it resumes.
func TestDashboardShowsReplicaLag(t *testing.T) {
	t.Logf("chromium: %s", browsertest.Chromium(t))
	if _, err := devpg.BinDir(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	primary, err := devpg.Start(ctx, devpg.Options{Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() }) //nolint:errcheck
	standby, err := devpg.StartStandby(ctx, primary, devpg.StandbyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() }) //nolint:errcheck
	pool, err := pgxpool.New(ctx, primary.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := migrations.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	read, err := pgxpool.New(ctx, standby.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(read.Close)
	h, err := admin.Handler(pool, &admin.Config{Auth: &admin.Auth{Issuer: issuer, Audience: audience, HS256Secret: secret}, ReadPool: read})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	f := &fixture{t: t, ctx: ctx, pool: pool, url: srv.URL + "/ui/"}
	tab := browsertest.Tab(t, browsertest.New(t))
	f.signIn(t, tab, f.token("reader@example.com", admin.ScopeRead))

	// badge navigates to route (each page shows the lag anew) and waits
	// until the badge's text satisfies cond (a JavaScript expression over
	// s), returning it.
	badge := func(route, cond string) string {
		t.Helper()
		browsertest.Run(t, tab, "open "+route, chromedp.Navigate(f.url+route))
		return browsertest.Value(t, tab, "the replica badge ("+cond+")", chromedp.Poll[string](
			`(b => b && !b.hidden && (s => (`+cond+`) && s)(b.textContent))(document.getElementById("replica"))`))
	}
	if got := badge("#/jobs", `s === "replica lag 0 s"`); got != "replica lag 0 s" {
		t.Errorf("caught up: %q", got)
	}
	if _, err := read.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}
	if _, err := core.Enqueue(ctx, pool, plainArgs{K: "replica.job"}, nil); err != nil {
		t.Fatal(err)
	}
	// The write is past the paused replay at once: a lag.
	behind := badge("#/", `s !== "replica lag 0 s"`)
	if !strings.HasPrefix(behind, "replica lag ") || !strings.HasSuffix(behind, " s") {
		t.Errorf("behind: %q", behind)
	}
	title := browsertest.Value(t, tab, "the badge's title", chromedp.Evaluate[string](`document.getElementById("replica").title`))
	if !strings.Contains(title, "kB of WAL behind the primary") {
		t.Errorf("the badge's title: %q", title)
	}
	if _, err := read.Exec(ctx, `SELECT pg_wal_replay_resume()`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for route := 0; ; route++ {
		// Navigate between two pages until the lag drained.
		r := []string{"#/jobs", "#/"}[route%2]
		browsertest.Run(t, tab, "open "+r, chromedp.Navigate(f.url+r))
		got := browsertest.Value(t, tab, "the replica badge", chromedp.Poll[string](
			`(b => b && !b.hidden && b.textContent)(document.getElementById("replica"))`))
		if got == "replica lag 0 s" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the badge never showed the replica caught up again: %q", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
