package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/browsertest"
	"github.com/relayq/relay/testkit/testdb"
)

type mailArgs struct{}

func (mailArgs) Kind() string { return "mail.send" }

// TestServeDashboardLoginLink runs the built relay binary as the README
// does — relay serve on loopback with RELAY_JWT_SECRET — opens the one-time
// login link it prints in headless Chromium, sees the overview, and pauses
// a queue from the dashboard.
func TestServeDashboardLoginLink(t *testing.T) {
	browsertest.Chromium(t) // skip before building when there is no browser
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := core.Enqueue(ctx, pool, mailArgs{}, &core.EnqueueOpts{Queue: "mail"}); err != nil {
		t.Fatal(err)
	}
	bin := buildRelay(t)
	addr := freeAddr(t)
	cmd := exec.Command(bin, "serve", "--database-url", pool.Config().ConnString(), "--listen", addr)
	cmd.Env = append(os.Environ(), "RELAY_JWT_SECRET=dashboard-test-secret-0123456789abcdef")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt) //nolint:errcheck // it may have exited
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill() //nolint:errcheck // it would not stop
		}
	})
	links := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`one-time dashboard login link .*: (http://\S+/ui/#login=[A-Za-z0-9]+)`)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				links <- m[1]
			}
		}
	}()
	var link string
	select {
	case link = <-links:
	case <-time.After(60 * time.Second):
		t.Fatal("relay serve printed no login link")
	}

	tab := browsertest.Tab(t, browsertest.New(t))
	browsertest.Run(t, tab, "open the login link",
		chromedp.Navigate(link),
		chromedp.WaitVisible(chromedp.CSS(`button[data-queue="mail"][data-queue-action="pause"]`)))
	if who := browsertest.Value(t, tab, "who", chromedp.Text(chromedp.CSS("#who-name"))); who != "dashboard-login" {
		t.Fatalf("signed in as %q", who)
	}
	browsertest.Run(t, tab, "pause queue mail",
		chromedp.Click(chromedp.CSS(`button[data-queue="mail"][data-queue-action="pause"]`)),
		chromedp.WaitVisible(chromedp.CSS(`button[data-queue="mail"][data-queue-action="resume"]`)))
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_queue_pauses WHERE queue = 'mail'`); n != 1 {
		t.Fatal("queue mail is not paused in the database")
	}
}
