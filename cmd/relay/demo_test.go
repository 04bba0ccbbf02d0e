package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/testkit/testdb"
)

// The demo leaves, in the database it used, what the dashboard shows: the
// three plain jobs (one dead), a completed, a compensated and a waiting
// payment run, the month-end schedule with a fire, dispatched outbox events
// and their jobs, and a job traced across its retries; it ends by printing
// the command that opens the dashboard on them, and that command serves
// them with a one-time login link. Run twice, it keeps both runs' data.
func TestDemoFillsTheDashboard(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	pool := testdb.New(t)
	url := pool.Config().ConnString()
	for i := range 2 {
		out, errOut, code := runRelay(t, bin, "demo", "--database-url", url)
		if code != 0 {
			t.Fatalf("relay demo (run %d): exit %d\n%s\n%s", i+1, code, out, errOut)
		}
		for _, want := range []string{": completed (payment", ": compensated: ", `: waiting for the signal "confirmed"`,
			"next fire ", "dispatched 2 event(s) into jobs", "go run ./cmd/relay demo --dashboard --database-url '" + url + "'"} {
			if !strings.Contains(out, want) {
				t.Errorf("run %d: the demo's output lacks %q:\n%s", i+1, want, out)
			}
		}
	}
	for what, q := range map[string]string{
		"2 completed runs":        `SELECT count(*) = 2 FROM relay_workflow_runs WHERE workflow = 'demo.payment' AND state = 'completed'`,
		"2 compensated runs":      `SELECT count(*) = 2 FROM relay_workflow_runs WHERE workflow = 'demo.payment' AND state = 'compensated'`,
		"2 waiting runs":          `SELECT count(*) = 2 FROM relay_workflow_runs WHERE workflow = 'demo.payment' AND state = 'running'`,
		"2 dead demo.doomed jobs": `SELECT count(*) = 2 FROM relay_jobs WHERE kind = 'demo.doomed' AND state = 'dead'`,
		"the schedule, fired": `SELECT count(*) = 1 FROM relay_schedules s WHERE name = 'month-end-settlement' AND disabled_at IS NULL
			AND (SELECT count(*) FROM relay_schedule_fires f WHERE f.schedule = s.name) = 2`,
		"4 dispatched events": `SELECT count(*) = 4 FROM relay_outbox WHERE topic = 'order.paid' AND dispatched_at IS NOT NULL`,
		"4 receipt jobs done": `SELECT count(*) = 4 FROM relay_jobs WHERE kind = 'demo.receipt' AND state = 'succeeded'`,
		"a job traced across its 3 attempts": `SELECT count(*) = 2 FROM relay_jobs WHERE kind = 'demo.flaky' AND state = 'succeeded'
			AND attempt = 3 AND metadata ? 'traceparent'`,
	} {
		var ok bool
		if err := pool.QueryRow(context.Background(), q).Scan(&ok); err != nil || !ok {
			t.Errorf("the demo left no %s (%v)", what, err)
		}
	}

	demoDashboard(t, bin, url)
}

// demoDashboard runs `relay demo --dashboard` on url, stopped when the test
// ends, and returns the one-time login link it prints.
func demoDashboard(t *testing.T, bin, url string) string {
	t.Helper()
	cmd := exec.Command(bin, "demo", "--dashboard", "--database-url", url, "--listen", freeAddr(t))
	cmd.Env = append(os.Environ(), "DATABASE_URL=", "RELAY_JWT_SECRET=")
	stdout, err := cmd.StdoutPipe()
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
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				links <- m[1]
			}
		}
	}()
	select {
	case link := <-links:
		return link
	case <-time.After(2 * time.Minute):
		t.Fatal("relay demo --dashboard printed no login link")
	}
	return ""
}
