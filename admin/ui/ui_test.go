package ui

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestOneTimeLogin: a code is exchanged for a token once; a used, unknown
// or expired code is refused with a problem; only POST /ui/login exchanges.
func TestOneTimeLogin(t *testing.T) {
	t.Parallel()
	minted := 0
	l := NewOneTimeLogin(func() (string, error) { minted++; return "tok-" + strings.Repeat("x", minted), nil })
	h := Handler(&Options{Login: l})
	post := func(body string) (int, string, string) {
		req := httptest.NewRequest(http.MethodPost, "/ui/login", strings.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Header().Get("Content-Type"), rec.Body.String()
	}
	code := l.NewCode(time.Minute)
	if c, _, b := post(`{"code":"` + code + `"}`); c != 200 || !strings.Contains(b, `"token":"tok-x"`) {
		t.Fatalf("exchange: %d %s", c, b)
	}
	for name, body := range map[string]string{
		"reused":  `{"code":"` + code + `"}`,
		"unknown": `{"code":"AAAAAAAAAAAAAAAAAAAAAAAAAA"}`,
	} {
		if c, ct, b := post(body); c != 403 || ct != "application/problem+json" || !strings.Contains(b, "unknown, used or expired") {
			t.Errorf("%s code: %d %s %s", name, c, ct, b)
		}
	}
	if c, ct, _ := post(`not json`); c != 400 || ct != "application/problem+json" {
		t.Errorf("bad body: %d %s", c, ct)
	}
	expired := l.NewCode(time.Minute)
	for k := range l.codes { // age it past its expiry
		l.codes[k] = time.Now().Add(-time.Second)
	}
	if c, _, _ := post(`{"code":"` + expired + `"}`); c != 403 {
		t.Errorf("expired code: %d", c)
	}
	if minted != 1 {
		t.Errorf("%d tokens minted, want 1", minted)
	}
	// Without Login, or with another method, nothing is exchanged.
	rec := httptest.NewRecorder()
	Handler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/ui/login", strings.NewReader(`{"code":"x"}`)))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST without Login: %d", rec.Code)
	}
}

// TestHandlerServesFiles: the pages, scripts and styles are embedded and
// served with a strict content security policy.
func TestHandlerServesFiles(t *testing.T) {
	t.Parallel()
	h := Handler(nil)
	for path, want := range map[string]string{
		"/ui/":                "<title>Relay dashboard</title>",
		"/ui/app.css":         "--focus",
		"/ui/js/app.js":       "hashchange",
		"/ui/js/api.js":       "sessionStorage",
		"/ui/js/overview.js":  "s('svg'",
		"/ui/js/run.js":       "s('svg'",
		"/ui/js/workflows.js": "v1/workflows/runs",
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != 200 {
			t.Errorf("GET %s: %d", path, rec.Code)
			continue
		}
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("GET %s lacks %q", path, want)
		}
		if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") {
			t.Errorf("GET %s: CSP %q", path, csp)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/js/", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("GET /ui/js/: %d, want 404 (no directory listing)", rec.Code)
	}
	// No file fetches anything from another origin.
	for _, path := range []string{"/ui/", "/ui/app.css", "/ui/js/app.js", "/ui/js/dom.js"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if b := rec.Body.String(); strings.Contains(b, "https://") || strings.Contains(b, "//cdn") {
			t.Errorf("%s refers to another origin", path)
		}
	}
}

// TestMissingFileIsAProblem: a page or file the dashboard does not have is
// answered 404 with a problem+json body, as every other error of the API,
// not the file server's plain text.
func TestMissingFileIsAProblem(t *testing.T) {
	t.Parallel()
	h := Handler(nil)
	for _, path := range []string{"/ui/nope.js", "/ui/js/nope.js", "/ui/js", "/ui/../admin.go", "/ui/js/", "/ui/static/index.html"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusNotFound || rec.Header().Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(rec.Body.String(), `"status":404`) {
			t.Errorf("GET %s: %d %s %s", path, rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
		}
	}
}
