package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/testdb"
)

// TestREADMEAdminWalkthrough runs the README's admin walkthrough — its exact
// lines, read from README.md — against a fresh database and a free port,
// with `make build` and `make demo` standing for their Makefile recipes on
// the binary built here, and checks what each step is said to show.
func TestREADMEAdminWalkthrough(t *testing.T) {
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the walkthrough needs %s (.ci/run installs it)", tool)
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- admin-walkthrough:start -->\n```sh\n(.*?)```\n<!-- admin-walkthrough:end -->").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README has no admin walkthrough block")
	}
	script := string(m[1])
	const readmeURL = "'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'"
	for _, must := range []string{readmeURL, "127.0.0.1:8080", "make build\n", "make demo\n", "bin/relay serve", "bin/relay token", "/requeue", "kill $SERVE"} {
		if !strings.Contains(script, must) {
			t.Fatalf("walkthrough lacks %q; update this test with it", must)
		}
	}

	pool := testdb.New(t)
	url := pool.Config().ConnString()
	addr := freeAddr(t)
	script = strings.ReplaceAll(script, readmeURL, "'"+url+"'")
	script = strings.ReplaceAll(script, "127.0.0.1:8080", addr)

	bin := buildRelay(t)
	dir := t.TempDir()
	// `make build` and `make demo` are the Makefile's recipes (go build -o
	// bin/relay; go run ./cmd/relay demo) on the binary built above.
	prelude := `make() { case "$1" in build) mkdir -p bin && cp "$RELAY_BIN" bin/relay ;; demo) bin/relay demo ;; *) return 1 ;; esac; }
trap 'kill $SERVE 2>/dev/null || true' EXIT
`
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", prelude+script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "RELAY_BIN="+bin, "DATABASE_URL=", "RELAY_JWT_SECRET=")
	out, err := cmd.CombinedOutput()
	t.Logf("walkthrough output:\n%s", out)
	if err != nil {
		t.Fatalf("walkthrough failed: %v", err)
	}
	s := string(out)
	for _, want := range []string{
		`"status":"ready"`,                         // readyz
		`"kind":"demo.doomed"`,                     // the dead job found
		`the card was declined`,                    // its error read
		`"outcome":"failed"`,                       // its attempts
		`"state":"queued"`,                         // requeued
		"\"state\":\"succeeded\"\n",                // and succeeded
		`"action":"jobs.requeue"`,                  // audited
		`"subject":"oncall@example.com"`,           // by the token's subject
		"relay serve: admin API on http://" + addr, // the server said where
	} {
		if !strings.Contains(s, want) {
			t.Errorf("walkthrough output lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "bin", "relay")); err != nil {
		t.Fatal(err)
	}
}

// TestServeRefusesOpenNonLoopback: without authentication, relay serve
// listens on loopback only; with none configured it does not start.
func TestServeRefusesOpenNonLoopback(t *testing.T) {
	t.Setenv("RELAY_JWT_SECRET", "")
	ctx := context.Background()
	for _, args := range [][]string{
		{"--database-url", "postgres://unused", "--no-auth", "--listen", "0.0.0.0:0"},
		{"--database-url", "postgres://unused", "--no-auth", "--listen", ":0"},
		{"--database-url", "postgres://unused", "--no-auth", "--listen", "192.168.1.10:0"},
		{"--database-url", "postgres://unused", "--listen", "127.0.0.1:0"},
	} {
		err := runServe(ctx, args)
		if err == nil || !(strings.Contains(err.Error(), "refusing") || strings.Contains(err.Error(), "no authentication")) {
			t.Errorf("serve %v: %v", args, err)
		}
	}
}

// TestServeRefusesAnUnmigratedDatabase: relay serve does not start on a
// database with migrations pending (it would answer every call with a
// 500), and says what to do; --allow-unmigrated serves anyway.
func TestServeRefusesAnUnmigratedDatabase(t *testing.T) {
	t.Setenv("RELAY_JWT_SECRET", "")
	url := testdb.EmptyURL(t)
	err := runServe(context.Background(), []string{"--database-url", url, "--listen", freeAddr(t), "--no-auth"})
	if !errors.Is(err, migrations.ErrNotMigrated) || !strings.Contains(err.Error(), "migrations pending — run `relay migrate` (or pass --allow-unmigrated") {
		t.Fatalf("serve on an unmigrated database = %v, want a refusal saying what to do", err)
	}
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runServe(ctx, []string{"--database-url", url, "--listen", addr, "--no-auth", "--allow-unmigrated"})
	}()
	testdb.WaitFor(t, "relay serve --allow-unmigrated to listen", func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay serve did not stop")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestServeEndpoints: relay serve answers /healthz, /readyz, /metrics,
// /openapi.json and the API, with a problem body for an unknown route, and
// stops when its context ends; it lists itself among the live processes
// while it runs, and its entry is gone once it stopped.
func TestServeEndpoints(t *testing.T) {
	t.Setenv("RELAY_JWT_SECRET", "")
	pool := testdb.New(t)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runServe(ctx, []string{"--database-url", pool.Config().ConnString(), "--listen", addr, "--no-auth"})
	}()
	get := func(path string) (int, string, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, "", err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	testdb.WaitFor(t, "relay serve to listen", func() bool { code, _, _ := get("/healthz"); return code == 200 })
	for path, want := range map[string]string{
		"/readyz":       `"status":"ready"`,
		"/metrics":      "# HELP",
		"/openapi.json": `"openapi":"3.1.0"`,
		"/v1/queues":    `"items":[]`,
		"/v1/processes": `"role":"serve","name":"` + addr + `"`,
	} {
		if code, _, body := get(path); code != 200 || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d %.200s", path, code, body)
		}
	}
	if code, ct, _ := get("/nope"); code != 404 || ct != "application/problem+json" {
		t.Errorf("unknown route: %d %s", code, ct)
	}
	// Without authentication, /metrics and the probes answer loopback
	// hosts only, as the API does: a page rebound to 127.0.0.1 reads
	// nothing.
	for _, path := range []string{"/metrics", "/healthz", "/readyz", "/v1/queues"} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		req.Host = "rebound.example:8080"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("GET %s with Host rebound.example: %d %s %.200s, want a 403 problem", path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay serve did not stop")
	}
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_processes WHERE role = 'serve'`); n != 0 {
		t.Errorf("%d serve entries after shutdown; want none", n)
	}
}

// TestPauseAcrossProcesses: two relay serve processes, each running workers
// on queue "demo", with their own connections. A pause made through one
// process's API stops both from claiming; a resume through the other lets
// them run the jobs.
func TestPauseAcrossProcesses(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("needs bash")
	}
	pool := testdb.New(t)
	url := pool.Config().ConnString()
	bin := buildRelay(t)
	var addrs []string
	for range 2 {
		addr := freeAddr(t)
		cmd := exec.Command(bin, "serve", "--database-url", url, "--listen", addr, "--no-auth", "--demo-workers")
		cmd.Env = append(os.Environ(), "RELAY_JWT_SECRET=")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() })
		addrs = append(addrs, addr)
		testdb.WaitFor(t, "relay serve at "+addr, func() bool {
			resp, err := http.Get("http://" + addr + "/healthz")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == 200
		})
	}
	post := func(addr, path string) {
		t.Helper()
		resp, err := http.Post("http://"+addr+path, "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("POST %s: %d", path, resp.StatusCode)
		}
	}
	post(addrs[0], "/v1/queues/demo/pause")
	ctx := context.Background()
	var ids []int64
	for i := range 6 {
		r, err := core.Enqueue(ctx, pool, greetArgs{Name: fmt.Sprint(i)}, &core.EnqueueOpts{Queue: "demo"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	// Both processes were notified of the jobs and poll every second: a
	// negative check needs a window, here three poll intervals.
	time.Sleep(3 * time.Second)
	if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_jobs WHERE id = ANY($1) AND state <> 'queued'`, ids); n != 0 {
		t.Fatalf("%d jobs of the paused queue were claimed", n)
	}
	post(addrs[1], "/v1/queues/demo/resume")
	testdb.WaitFor(t, "the jobs to run after resume", func() bool {
		return testdb.Count(t, pool, `SELECT count(*) FROM relay_jobs WHERE id = ANY($1) AND state = 'succeeded'`, ids) == len(ids)
	})
}

// TestServeLoopbackRuleResolvesNames: a host name counts as loopback only
// when every address it resolves to is loopback — "localhost" included,
// since /etc/hosts decides what it means; unspecified addresses, an empty
// host and names that do not resolve are not loopback.
func TestServeLoopbackRuleResolvesNames(t *testing.T) {
	hosts := map[string][]string{
		"localhost":  {"127.0.0.1", "::1"},
		"evil-local": {"127.0.0.1", "10.0.0.7"},
		"remapped":   {"192.168.1.10"},
		"debian":     {"127.0.1.1"},
	}
	lookup := func(_ context.Context, host string) ([]net.IPAddr, error) {
		var out []net.IPAddr
		for _, a := range hosts[host] {
			out = append(out, net.IPAddr{IP: net.ParseIP(a)})
		}
		if len(out) == 0 {
			return nil, errors.New("no such host")
		}
		return out, nil
	}
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "[::1]:80": true, "127.0.0.2:1": true, "[::ffff:127.0.0.1]:1": true,
		"localhost:1": true, "debian:1": true,
		":8080": false, "0.0.0.0:1": false, "[::]:1": false, "10.0.0.1:1": false, "nohost": false,
		"evil-local:1": false, "remapped:1": false, "unknown:1": false,
	} {
		if got := loopbackOnly(context.Background(), addr, lookup); got != want {
			t.Errorf("loopbackOnly(%q) = %v, want %v", addr, got, want)
		}
	}
	hosts["localhost"] = []string{"10.1.2.3"} // a broken /etc/hosts
	if loopbackOnly(context.Background(), "localhost:1", lookup) {
		t.Error("localhost resolving to 10.1.2.3 counted as loopback")
	}
}

// relay serve --read-database-url reads the API's lists through a pool of
// its own: GET /v1/replica says a read pool is configured (here the same
// server, so not a standby).
func TestServeReadDatabaseURL(t *testing.T) {
	t.Setenv("RELAY_JWT_SECRET", "")
	pool := testdb.New(t)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	url := pool.Config().ConnString()
	go func() {
		done <- runServe(ctx, []string{"--database-url", url, "--read-database-url", url, "--listen", addr, "--no-auth"})
	}()
	var body string
	testdb.WaitFor(t, "relay serve to answer GET /v1/replica", func() bool {
		resp, err := http.Get("http://" + addr + "/v1/replica")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == 200
	})
	if !strings.Contains(body, `"configured":true`) || !strings.Contains(body, `"in_recovery":false`) {
		t.Errorf("GET /v1/replica: %s", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay serve did not stop")
	}
}

// TestServeRateLimit: relay serve --rate-limit holds the API to the rate
// (without authentication, one bucket for every request): the burst of 10
// is served, the next call is a 429 problem with Retry-After, and /healthz
// is not limited. A negative rate does not start.
func TestServeRateLimit(t *testing.T) {
	t.Setenv("RELAY_JWT_SECRET", "")
	pool := testdb.New(t)
	if err := runServe(context.Background(), []string{"--database-url", pool.Config().ConnString(), "--listen", freeAddr(t),
		"--no-auth", "--rate-limit", "-1"}); err == nil || !strings.Contains(err.Error(), "RateLimit") {
		t.Fatalf("--rate-limit -1: %v", err)
	}
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		// One request per 1000 s: the burst is all the test gets.
		done <- runServe(ctx, []string{"--database-url", pool.Config().ConnString(), "--listen", addr, "--no-auth", "--rate-limit", "0.001"})
	}()
	get := func(path string) *http.Response {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return nil
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck // drained
		resp.Body.Close()
		return resp
	}
	testdb.WaitFor(t, "relay serve to listen", func() bool { r := get("/healthz"); return r != nil && r.StatusCode == 200 })
	for i := range 10 {
		if r := get("/v1/queues"); r == nil || r.StatusCode != 200 {
			t.Fatalf("request %d of the burst: %v", i+1, r)
		}
	}
	r := get("/v1/queues")
	if r == nil || r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" ||
		r.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("past the burst: %v", r)
	}
	if r := get("/healthz"); r == nil || r.StatusCode != 200 {
		t.Fatalf("/healthz past the API's limit: %v", r)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay serve did not stop")
	}
}
