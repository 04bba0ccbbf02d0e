package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/admin"
	"github.com/relayq/relay/testkit/testdb"
)

// opEnv is a relay serve on a database the demo filled, and the binary to
// call it with.
type opEnv struct {
	t    *testing.T
	bin  string
	addr string
	env  []string // RELAY_URL and the rest, for every call
}

// startServe runs `relay serve` on url at a free address with the extra
// environment, until the test ends, and waits for it to answer.
func startServe(t *testing.T, bin, url string, env []string, args ...string) string {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(bin, append([]string{"serve", "--database-url", url, "--listen", addr, "--no-login-link"}, args...)...)
	cmd.Env = append(append(os.Environ(), "RELAY_JWT_SECRET=", "DATABASE_URL="), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt) //nolint:errcheck // it may have exited
		cmd.Wait()                       //nolint:errcheck // stopped
		if t.Failed() {
			t.Logf("relay serve at %s:\n%s", addr, out.String())
		}
	})
	testdb.WaitFor(t, "relay serve at "+addr, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return addr
}

// run runs `relay args...` against the server and returns stdout, stderr
// and the exit code.
func (e *opEnv) run(args ...string) (string, string, int) {
	e.t.Helper()
	cmd := exec.Command(e.bin, args...)
	cmd.Env = append(append(os.Environ(), "DATABASE_URL=", "RELAY_TOKEN=", "TZ=UTC"), e.env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("relay %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// ok runs a command that must succeed and returns its stdout.
func (e *opEnv) ok(args ...string) string {
	e.t.Helper()
	out, errOut, code := e.run(args...)
	if code != 0 || errOut != "" {
		e.t.Fatalf("relay %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// fails runs a command that must fail (exit 1) with exactly one line on
// stderr, the one given.
func (e *opEnv) fails(want string, args ...string) {
	e.t.Helper()
	out, errOut, code := e.run(args...)
	if code != 1 || out != "" || errOut != want+"\n" {
		e.t.Errorf("relay %s: exit %d, stdout %q, stderr %q; want exit 1 and the one line %q", strings.Join(args, " "), code, out, errOut, want)
	}
}

// jsonOf runs a command with --output json and decodes its output into v.
func (e *opEnv) jsonOf(v any, args ...string) {
	e.t.Helper()
	if err := json.Unmarshal([]byte(e.ok(append(args, "--output", "json")...)), v); err != nil {
		e.t.Fatalf("relay %s --output json: %v", strings.Join(args, " "), err)
	}
}

// apiBody is GET path's body straight from the API.
func (e *opEnv) apiBody(path string) string {
	e.t.Helper()
	resp, err := http.Get("http://" + e.addr + path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// row is the table line whose first column is first, as its columns cut
// by the header's column starts: each header word starts a column, so the
// check fails unless the table is aligned.
func row(t *testing.T, table, first string) map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	header := lines[0]
	var starts []int
	var names []string
	for _, m := range regexp.MustCompile(`\S+(?: \S+)*`).FindAllStringIndex(header, -1) {
		starts = append(starts, m[0])
		names = append(names, header[m[0]:m[1]])
	}
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, first+" ") {
			continue
		}
		cols := map[string]string{}
		for i, s := range starts {
			end := len(l)
			if i+1 < len(starts) && starts[i+1] < end {
				end = starts[i+1]
			}
			if s > len(l) {
				cols[names[i]] = "" // an empty last column
				continue
			}
			if i > 0 && l[s-1] != ' ' {
				t.Fatalf("column %s does not start at its header's column:\n%s", names[i], table)
			}
			cols[names[i]] = strings.TrimSpace(l[s:end])
		}
		return cols
	}
	t.Fatalf("no row %q in:\n%s", first, table)
	return nil
}

// utcTime is a time as the commands print it (TZ=UTC).
var utcTime = regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+00:00$`)

// TestOperateCommands: relay jobs, runs, schedules and queues against a
// relay serve on the database `relay demo` filled — each command's table
// (aligned, times in one format with zone) and JSON (the API's as is),
// each change made, and a bad id, a bad flag and an unreachable server
// each saying so in one line with the exit code of every other command.
func TestOperateCommands(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	pool := testdb.New(t)
	url := pool.Config().ConnString()
	if out, errOut, code := runRelay(t, bin, "demo", "--database-url", url); code != 0 {
		t.Fatalf("relay demo: exit %d\n%s\n%s", code, out, errOut)
	}
	addr := startServe(t, bin, url, nil, "--no-auth")
	e := &opEnv{t: t, bin: bin, addr: addr, env: []string{"RELAY_URL=http://" + addr}}

	// Jobs: the demo's dead job, listed, shown, bulk-requeued dry and for
	// real, cancelled, requeued.
	dead := e.ok("jobs", "list", "--state", "dead", "--kind", "demo.doomed")
	var page struct {
		Items      []admin.Job `json:"items"`
		NextCursor string      `json:"next_cursor"`
	}
	e.jsonOf(&page, "jobs", "list", "--state", "dead", "--kind", "demo.doomed")
	if len(page.Items) != 1 {
		t.Fatalf("jobs list --state dead: %+v", page)
	}
	id := strconv.FormatInt(page.Items[0].ID, 10)
	r := row(t, dead, id)
	if r["KIND"] != "demo.doomed" || r["QUEUE"] != "demo" || r["STATE"] != "dead" || r["ATTEMPT"] != "3/3" ||
		r["LAST ERROR"] != "the card was declined" || !utcTime.MatchString(r["FINISHED"]) || !utcTime.MatchString(r["CREATED"]) {
		t.Errorf("jobs list row: %v\n%s", r, dead)
	}
	if got, want := e.ok("jobs", "list", "--state", "dead", "--kind", "demo.doomed", "--output", "json"),
		e.apiBody("/v1/jobs?state=dead&kind=demo.doomed&limit=50"); strings.TrimSpace(got) != strings.TrimSpace(want) {
		t.Errorf("--output json is not the API's JSON:\n%s\nwant\n%s", got, want)
	}
	// Paging: one job a page, the cursor printed leads to the next.
	first := e.ok("jobs", "list", "--limit", "1")
	m := regexp.MustCompile(`more: add --cursor (\S+)`).FindStringSubmatch(first)
	if m == nil {
		t.Fatalf("jobs list --limit 1 prints no cursor:\n%s", first)
	}
	if second := e.ok("jobs", "list", "--limit", "1", "--cursor", m[1]); second == first || !strings.HasPrefix(second, "ID ") {
		t.Errorf("the next page:\n%s\nafter\n%s", second, first)
	}
	show := e.ok("jobs", "show", id)
	for _, want := range []string{`\nkind: +demo.doomed\n`, `\nstate: +dead\n`, `\nattempt: +3 of 3\n`, `\nfinished: +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+00:00\n`, "\nattempts:\n"} {
		if !regexp.MustCompile(want).MatchString(show) {
			t.Errorf("jobs show lacks %q:\n%s", want, show)
		}
	}
	if a := row(t, show[strings.Index(show, "ATTEMPT "):], "3"); a["OUTCOME"] != "failed" || a["ERROR"] != "the card was declined" {
		t.Errorf("jobs show's third attempt: %v\n%s", a, show)
	}
	var detail admin.JobDetail
	e.jsonOf(&detail, "jobs", "show", id)
	if len(detail.Attempts) != 3 || detail.State != "dead" {
		t.Errorf("jobs show --output json: %+v", detail)
	}
	if out := e.ok("jobs", "bulk", "requeue", "--state", "dead", "--kind", "demo.doomed", "--dry-run"); out != "requeue: 1 matched, would change (dry run) 1, 0 skipped (moved on or locked), 0 batches\n" {
		t.Errorf("bulk dry run: %q", out)
	}
	if detail.State = jobState(t, e, id); detail.State != "dead" {
		t.Fatalf("a dry run changed the job: %s", detail.State)
	}
	if out := e.ok("jobs", "bulk", "requeue", "--state", "dead", "--kind", "demo.doomed"); out != "requeue: 1 matched, changed 1, 0 skipped (moved on or locked), 1 batches\n" {
		t.Errorf("bulk requeue: %q", out)
	}
	if s := jobState(t, e, id); s != "queued" {
		t.Fatalf("after bulk requeue the job is %s", s)
	}
	if out := e.ok("jobs", "cancel", id); out != "job "+id+": cancelled\n" {
		t.Errorf("jobs cancel: %q", out)
	}
	if out := e.ok("jobs", "requeue", "--output", "json", id); !strings.Contains(out, `"state":"queued"`) {
		t.Errorf("jobs requeue --output json: %q", out)
	}
	e.fails("relay jobs retry: 409 Conflict: jobs.retry_now refused for job "+id+": illegal job state transition: job is queued; it is not queued to run later", "jobs", "retry", id)
	e.fails("relay jobs show: 404 Not Found: job 999999 not found", "jobs", "show", "999999")
	e.fails(`relay jobs show: job id "4x": want a positive number`, "jobs", "show", "4x")
	e.fails("relay jobs bulk: bulk cancel without a filter would change every job it applies to: add filter flags (--state, --queue, --kind, ...), and run with --dry-run first", "jobs", "bulk", "cancel")
	e.fails("relay jobs list: 422 Unprocessable Entity: validation failed; query.limit: expected number <= 500 (501)", "jobs", "list", "--limit", "501")

	// Runs: the demo's completed, compensated and waiting payments.
	var runs struct {
		Items []admin.WorkflowRun `json:"items"`
	}
	e.jsonOf(&runs, "runs", "list", "--workflow", "demo.payment")
	byState := map[string]string{}
	for _, r := range runs.Items {
		byState[r.State] = r.ID
	}
	completed, compensated, waiting := byState["completed"], byState["compensated"], byState["running"]
	if completed == "" || compensated == "" || waiting == "" {
		t.Fatalf("runs list: %+v", runs.Items)
	}
	list := e.ok("runs", "list", "--workflow", "demo.payment")
	if r := row(t, list, compensated); r["STATE"] != "compensated" || r["QUEUE"] != "payments" || !utcTime.MatchString(r["FINISHED"]) || r["DURATION"] == "-" {
		t.Errorf("runs list row: %v\n%s", r, list)
	}
	show = e.ok("runs", "show", compensated)
	steps := show[strings.Index(show, "\nsteps:\n")+len("\nsteps:\n"):]
	steps = steps[:strings.Index(steps, "\n\n")]
	if s := row(t, steps, "0"); s["KEY"] != "charge" || s["STATE"] != "completed" {
		t.Errorf("the compensated run's first step: %v\n%s", s, show)
	}
	if !strings.Contains(steps, "compensate:refund") || !strings.Contains(show, "\nchildren:\n") || !strings.Contains(show, compensated+"/report") {
		t.Errorf("runs show of the compensated run lacks its refund or its children:\n%s", show)
	}
	// A child's id holds a slash: escaped, it reaches the API whole.
	child := compensated + "/report"
	if out := e.ok("runs", "show", child); !regexp.MustCompile(`(?m)^id: +`+regexp.QuoteMeta(child)+`$`).MatchString(out) || !regexp.MustCompile(`(?m)^state: +failed$`).MatchString(out) {
		t.Errorf("runs show %s:\n%s", child, out)
	}
	e.fails(`relay runs show: 404 Not Found: workflow run "nope/child" not found`, "runs", "show", "nope/child")
	e.fails(`relay runs show: 404 Not Found: workflow run ".." not found`, "runs", "show", "..")
	e.fails(`relay runs show: 404 Not Found: workflow run "a?b#c%d" not found`, "runs", "show", "a?b#c%d")
	e.fails(`relay runs signal: signal payload "{yes" is not JSON (a string is quoted: '"yes"')`, "runs", "signal", waiting, "confirmed", "{yes")
	if out := e.ok("runs", "signal", waiting, "confirmed", `"yes"`); out != "run "+waiting+": signal; now running\n" {
		t.Errorf("runs signal: %q", out)
	}
	if out := e.ok("runs", "cancel", waiting); out != "run "+waiting+": cancel; now running\n" {
		t.Errorf("runs cancel: %q", out)
	}
	if out := e.ok("runs", "terminate", waiting, "the customer called: duplicate order"); out != "run "+waiting+": terminate; now terminated\n" {
		t.Errorf("runs terminate: %q", out)
	}
	if r := row(t, e.ok("runs", "list", "--state", "terminated"), waiting); !strings.HasPrefix(r["ERROR"], "workflow: run "+waiting+" terminated: ") {
		t.Errorf("the terminated run: %v", r)
	}
	e.fails(`relay runs terminate: 409 Conflict: terminate workflow run refused: run "`+completed+`" has finished`, "runs", "terminate", completed, "too late")
	e.fails(`relay runs retry: 409 Conflict: retry workflow run refused: run "`+completed+`" is not failed (only a failed run can be retried; a compensated or cancelled run has undone its work)`, "runs", "retry", completed)

	// Schedules: the month-end settlement, its next fires at 18:00 Paris
	// time whatever the zone the command runs in; paused, resumed,
	// triggered.
	sched := e.ok("schedules", "list")
	s := row(t, sched, "month-end-settlement")
	if s["SPEC"] != "0 18 L * *" || s["ZONE"] != "Europe/Paris" || s["STATE"] != "active" {
		t.Errorf("schedules list row: %v\n%s", s, sched)
	}
	fires := strings.Split(s["NEXT FIRES"], ", ")
	if len(fires) != 3 {
		t.Fatalf("next fires: %q", s["NEXT FIRES"])
	}
	for _, f := range fires {
		if !regexp.MustCompile(`^\d{4}-\d\d-\d\d 18:00:00 \+0[12]:00$`).MatchString(f) {
			t.Errorf("next fire %q is not 18:00 in Paris with its offset", f)
		}
	}
	if out := e.ok("schedules", "pause", "month-end-settlement"); out != "schedule month-end-settlement: pause\n" {
		t.Errorf("schedules pause: %q", out)
	}
	if s := row(t, e.ok("schedules", "list"), "month-end-settlement"); s["STATE"] != "paused" {
		t.Errorf("after pause: %v", s)
	}
	e.ok("schedules", "resume", "month-end-settlement")
	if out := e.ok("schedules", "trigger", "month-end-settlement"); !regexp.MustCompile(`^schedule month-end-settlement: trigger; job \d+ enqueued\n$`).MatchString(out) {
		t.Errorf("schedules trigger: %q", out)
	}
	show = e.ok("schedules", "show", "month-end-settlement", "--next", "2")
	fires = regexp.MustCompile(`(?m)^  (\d{4}-\d\d-\d\d 18:00:00 \+0[12]:00)$`).FindAllString(show, -1)
	latest := show[strings.Index(show, "FIRE TIME"):]
	if !regexp.MustCompile(`(?m)^spec: +0 18 L \* \*$`).MatchString(show) || len(fires) != 2 || strings.Count(latest, " triggered ") != 2 {
		t.Errorf("schedules show: %d next fires, latest:\n%s", len(fires), show)
	}
	e.fails(`relay schedules show: 404 Not Found: schedule "nope" not found`, "schedules", "show", "nope")
	e.fails(`relay schedules pause: 404 Not Found: schedule "nope" not found`, "schedules", "pause", "nope")

	// Queues.
	queues := e.ok("queues", "list")
	if q := row(t, queues, "payments"); q["STATE"] != "active" || q["SUCCEEDED/15m"] == "" {
		t.Errorf("queues list row: %v\n%s", q, queues)
	}
	if out := e.ok("queues", "pause", "demo"); out != "queue demo: paused\n" {
		t.Errorf("queues pause: %q", out)
	}
	if out := e.ok("queues", "pause", "demo"); out != "queue demo: already paused\n" {
		t.Errorf("queues pause again: %q", out)
	}
	if q := row(t, e.ok("queues", "list"), "demo"); q["STATE"] != "paused by anonymous" {
		t.Errorf("a paused queue: %v", q)
	}
	if out := e.ok("queues", "resume", "demo"); out != "queue demo: running\n" {
		t.Errorf("queues resume: %q", out)
	}

	if q := row(t, e.ok("queues", "list"), "demo"); q["STATE"] != "active, no live process serves it" || q["RUNNABLE"] != "2" || q["PROCESSES"] != "0" {
		t.Errorf("a queue with runnable jobs and no worker: %v", q)
	}

	// Processes: relay serve records itself; the demo's workers, stopped,
	// are gone.
	host, _ := os.Hostname()
	procs := e.ok("processes")
	if p := row(t, procs, "serve"); p["HOST"] != host || !utcTime.MatchString(p["LAST SEEN"]) || p["PID"] == "" {
		t.Errorf("processes: the serve row %v\n%s", p, procs)
	}
	var ps struct {
		Items []admin.Process `json:"items"`
	}
	if e.jsonOf(&ps, "processes", "--role", "worker"); len(ps.Items) != 0 {
		t.Errorf("processes --role worker after the demo stopped its workers: %+v", ps.Items)
	}

	// --output json is the API's body as it answered, for each read
	// whose answer does not move between two calls.
	for path, args := range map[string][]string{
		"/v1/jobs?limit=50":                    {"jobs", "list"},
		"/v1/jobs/" + id:                       {"jobs", "show", id},
		"/v1/workflows/runs?limit=50":          {"runs", "list"},
		"/v1/workflows/runs/" + segment(child): {"runs", "show", child},
		"/v1/schedules?last=1&next=3":          {"schedules", "list"},
	} {
		if got, want := e.ok(append(args, "--output", "json")...), e.apiBody(path); strings.TrimSpace(got) != strings.TrimSpace(want) {
			t.Errorf("relay %s --output json is not GET %s:\n%s\nwant\n%s", strings.Join(args, " "), path, got, want)
		}
	}
	var qs struct {
		Items []admin.Queue `json:"items"`
	}
	if e.jsonOf(&qs, "queues", "list"); len(qs.Items) != 3 || qs.Items[0].WindowMinutes != 15 {
		t.Errorf("queues list --output json: %+v", qs.Items)
	}
	for args, want := range map[string]string{
		"queues pause email":                      `{"queue":"email","paused":true,"changed":true}`,
		"schedules pause month-end-settlement":    `{"name":"month-end-settlement","action":"pause"}`,
		"jobs bulk delete --kind no.such --max 5": `{"action":"delete","dry_run":false,"matched":0,"changed":0,"skipped":0,"batches":0,"done":true}`,
	} {
		if got := e.ok(append(strings.Fields(args), "--output", "json")...); strings.TrimSpace(got) != want {
			t.Errorf("relay %s --output json: %s, want %s", args, got, want)
		}
	}
	// A finished job deleted.
	e.ok("jobs", "cancel", id)
	if out := e.ok("jobs", "delete", id); out != "job "+id+": deleted\n" {
		t.Errorf("jobs delete: %q", out)
	}
	e.fails("relay jobs show: 404 Not Found: job "+id+" not found", "jobs", "show", id)

	// No server there; a URL that is not one.
	e.fails("relay queues list: cannot reach relay serve at http://127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused", "queues", "list", "--url", "http://127.0.0.1:1")
	e.fails(`relay queues list: --url "ftp://host": want relay serve's address, e.g. http://127.0.0.1:8080`, "queues", "list", "--url", "ftp://host")
}

func jobState(t *testing.T, e *opEnv, id string) string {
	t.Helper()
	var j admin.JobDetail
	e.jsonOf(&j, "jobs", "show", id)
	return j.State
}

// With authentication: a token from --token or $RELAY_TOKEN is sent, a bad
// one is the API's 401 in one line, a read-only one may read and not
// change.
func TestOperateWithAToken(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	pool := testdb.New(t)
	secret := "a-secret-of-at-least-32-bytes-for-the-test"
	addr := startServe(t, bin, pool.Config().ConnString(), []string{"RELAY_JWT_SECRET=" + secret})
	mint := func(scopes ...string) string {
		tok, err := admin.MintToken([]byte(secret), admin.TokenOpts{Issuer: defaultIssuer, Audience: defaultAudience,
			Subject: "oncall", Scopes: scopes, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	rw, ro := mint(admin.ScopeRead, admin.ScopeWrite), mint(admin.ScopeRead)
	e := &opEnv{t: t, bin: bin, addr: addr, env: []string{"RELAY_URL=http://" + addr}}
	e.fails("relay queues list: 401 Unauthorized: a bearer token is required (Authorization: Bearer <JWT>) — no token sent: set $RELAY_TOKEN or pass --token (relay token mints one)", "queues", "list")
	out, errOut, code := e.run("queues", "list", "--token", "not-a-token")
	if code != 1 || !strings.HasPrefix(errOut, "relay queues list: 401 Unauthorized: ") || strings.Count(errOut, "\n") != 1 || out != "" {
		t.Errorf("a bad token: exit %d, %q", code, errOut)
	}
	if out := e.ok("queues", "pause", "mail", "--token", rw); out != "queue mail: paused\n" {
		t.Errorf("queues pause with a token: %q", out)
	}
	e.env = append(e.env, "RELAY_TOKEN="+ro)
	if q := row(t, e.ok("queues", "list"), "mail"); q["STATE"] != "paused by oncall" {
		t.Errorf("queues list with $RELAY_TOKEN: %v", q)
	}
	out, errOut, code = e.run("queues", "resume", "mail")
	if code != 1 || !strings.HasPrefix(errOut, "relay queues resume: 403 Forbidden: ") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("a read-only token's change: exit %d, %q %q", code, out, errOut)
	}
}

// Bad command lines exit 2 with the error once and the usage, before any
// call; help exits 0 and never prints the token.
func TestOperateUsage(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	e := &opEnv{t: t, bin: bin, env: []string{"RELAY_URL=http://127.0.0.1:1", "RELAY_TOKEN=secret-token-value"}}
	for _, args := range [][]string{
		{"jobs"}, {"jobs", "bogus"}, {"jobs", "show"}, {"jobs", "show", "1", "2"}, {"jobs", "list", "--limit", "many"},
		{"jobs", "list", "--output", "yaml"}, {"jobs", "list", "--created-after", "yesterday"}, {"runs", "show", ""},
		{"runs", "signal", "r1"}, {"runs", "terminate", "r1"}, {"schedules", "trigger"}, {"queues", "pause", "a", "b"}, {"queues", "list", "stray"}, {"processes", "stray"}, {"processes", "--role"},
	} {
		out, errOut, code := e.run(args...)
		first := strings.SplitN(errOut, "\n", 2)[0]
		if code != 2 || out != "" || !strings.HasPrefix(first, "relay "+args[0]) || strings.Count(errOut, first) != 1 || !strings.Contains(errOut, "Usage: relay "+args[0]) {
			t.Errorf("relay %q: exit %d, stdout %q, stderr:\n%s\nwant exit 2, the error once, and the usage", args, code, out, errOut)
		}
	}
	for _, args := range [][]string{{"jobs", "--help"}, {"runs", "help"}, {"jobs", "show", "--help"}, {"runs", "signal", "-h"},
		{"schedules", "list", "--help"}, {"queues", "--help"}, {"help", "jobs", "bulk"}, {"processes", "--help"}} {
		out, errOut, code := e.run(args...)
		if code != 0 || errOut != "" || !strings.Contains(out, "Usage: relay ") || strings.Contains(out, "secret-token-value") {
			t.Errorf("relay %q: exit %d, stderr %q\n%s", args, code, errOut, out)
		}
	}
	out, _, _ := e.run("--help")
	for _, cmd := range []string{"relay jobs ", "relay runs ", "relay schedules ", "relay queues ", "relay processes "} {
		if !strings.Contains(out, cmd) {
			t.Errorf("relay --help does not list %q:\n%s", cmd, out)
		}
	}
	// Another server at --url: its page is no answer, and its error page
	// is cut to one line.
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/jobs" {
			http.Error(w, "<html>\n<h1>Bad Gateway</h1>\n</html>", http.StatusBadGateway)
			return
		}
		w.Write([]byte("<html>welcome</html>")) //nolint:errcheck // the test reads it
	}))
	defer other.Close()
	e.fails("relay queues list: GET /v1/queues: the answer is not what relay serve answers (another server at "+other.URL+
		"?): invalid character '<' looking for beginning of value", "queues", "list", "--url", other.URL)
	e.fails("relay jobs list: 502 Bad Gateway: <html> <h1>Bad Gateway</h1> </html>", "jobs", "list", "--url", other.URL)
	// A URL's password is never printed.
	e.fails("relay queues list: cannot reach relay serve at http://127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused",
		"queues", "list", "--url", "http://ops:hunter2@127.0.0.1:1")
	// Flags after the arguments, and an argument after "--".
	if _, errOut, code := e.run("jobs", "show", "7", "--url", "http://127.0.0.1:1"); code != 1 || !strings.Contains(errOut, "cannot reach relay serve") {
		t.Errorf("a flag after the id: exit %d, %q", code, errOut)
	}
	if _, errOut, code := e.run("runs", "signal", "--", "r1", "n", "-5"); code != 1 || !strings.Contains(errOut, "cannot reach relay serve") {
		t.Errorf("a payload after --: exit %d, %q", code, errOut)
	}
}

// Past relay serve's rate limit, a command says when to try again.
func TestOperateRateLimited(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	pool := testdb.New(t)
	// One request per 1000 s: the burst of 10 is all the test gets.
	addr := startServe(t, bin, pool.Config().ConnString(), nil, "--no-auth", "--rate-limit", "0.001")
	e := &opEnv{t: t, bin: bin, addr: addr, env: []string{"RELAY_URL=http://" + addr}}
	for range 10 {
		e.ok("queues", "list")
	}
	out, errOut, code := e.run("queues", "list")
	if code != 1 || out != "" || !regexp.MustCompile(`^relay queues list: 429 Too Many Requests: .* — retry after \d+s\n$`).MatchString(errOut) {
		t.Errorf("past the rate limit: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
