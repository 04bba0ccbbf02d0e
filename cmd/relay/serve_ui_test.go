package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/testkit/testdb"
)

// TestServeDashboard: relay serve serves the dashboard under /ui/ (and
// sends / there), with its scripts, under a strict content security policy.
func TestServeDashboard(t *testing.T) {
	t.Setenv("RELAY_JWT_SECRET", "")
	pool := testdb.New(t)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runServe(ctx, []string{"--database-url", pool.Config().ConnString(), "--listen", addr, "--no-auth",
			"--trace-url", "http://localhost:16686/trace/{trace_id}"})
	}()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) (*http.Response, string) {
		resp, err := noRedirect.Get("http://" + addr + path)
		if err != nil {
			return nil, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	testdb.WaitFor(t, "relay serve to listen", func() bool { r, _ := get("/healthz"); return r != nil && r.StatusCode == 200 })
	if r, _ := get("/"); r.StatusCode != http.StatusFound || r.Header.Get("Location") != "ui/" {
		t.Errorf("GET /: %d to %q", r.StatusCode, r.Header.Get("Location"))
	}
	for path, want := range map[string]string{
		"/ui/":          "<title>Relay dashboard</title>",
		"/ui/js/app.js": "v1/whoami",
		"/ui/js/job.js": "trace_url",
	} {
		r, body := get(path)
		if r == nil || r.StatusCode != 200 || !strings.Contains(body, want) {
			t.Errorf("GET %s: %v %.200s", path, r, body)
			continue
		}
		if !strings.Contains(r.Header.Get("Content-Security-Policy"), "default-src 'none'") {
			t.Errorf("GET %s: no CSP", path)
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
}
