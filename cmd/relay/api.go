package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
)

// Environment variables of the commands that call a running relay serve.
const (
	apiURLEnv   = "RELAY_URL"
	apiTokenEnv = "RELAY_TOKEN"
)

// defaultAPIURL is where relay serve listens by default (its --listen).
const defaultAPIURL = "http://127.0.0.1:8080"

// apiTimeout bounds one call: longer than relay serve's own request
// timeout (admin.Config.RequestTimeout, 60s), so a slow call ends with the
// server's problem rather than the client giving up first.
const apiTimeout = 90 * time.Second

// maxAPIResponse bounds the body the client reads: a run's page (64 KiB
// per step output, up to 1000 children) is the largest answer.
const maxAPIResponse = 64 << 20

// apiFlags are the flags every command over the admin API takes.
type apiFlags struct {
	url    string
	token  string
	output outputFormat
}

// addAPIFlags registers --url, --token and --output on fs.
func addAPIFlags(fs *flag.FlagSet) *apiFlags {
	f := &apiFlags{output: "table"}
	fs.StringVar(&f.url, "url", cmpEnv(apiURLEnv, defaultAPIURL), "relay serve's address")
	fs.StringVar(&f.token, "token", os.Getenv(apiTokenEnv), "bearer token (relay token mints one); prefer $"+apiTokenEnv+": command lines show in ps")
	fs.Var(&f.output, "output", "output `format`: table (for people) or json (the API's JSON as it answered, for scripts)")
	return f
}

func cmpEnv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// outputFormat is --output: table or json.
type outputFormat string

func (o *outputFormat) String() string { return string(*o) }

func (o *outputFormat) Set(s string) error {
	if s != "table" && s != "json" {
		return fmt.Errorf("want table or json, not %q", s)
	}
	*o = outputFormat(s)
	return nil
}

// client checks --url and returns a client for it.
func (f *apiFlags) client() (*apiClient, error) {
	u, err := url.Parse(f.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("--url %q: want relay serve's address, e.g. %s", redactURL(f.url), defaultAPIURL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	return &apiClient{base: u, token: f.token, http: &http.Client{Timeout: apiTimeout}}, nil
}

// redactURL is a URL fit to print: without its user information (a
// password), or only its scheme when it does not parse.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		scheme, _, _ := strings.Cut(raw, "://")
		return scheme + "://…"
	}
	u.User = nil
	return u.String()
}

// apiClient calls the admin API of a running relay serve.
type apiClient struct {
	base  *url.URL
	token string
	http  *http.Client
}

// apiError is a problem the API answered (RFC 9457), in one line:
// "404 Not Found: job 42 not found".
type apiError struct {
	status  int
	problem huma.ErrorModel
	body    string // the start of a body that was no problem (a proxy's page)
	hint    string // what the client knows of the cause
}

func (e *apiError) Error() string {
	msg := fmt.Sprintf("%d %s", e.status, http.StatusText(e.status))
	detail := e.problem.Detail
	if detail == "" {
		detail = e.body
	}
	if detail != "" {
		msg += ": " + detail
	}
	for _, d := range e.problem.Errors {
		if d == nil {
			continue
		}
		msg += "; " + d.Location + ": " + d.Message
		if d.Value != nil {
			if b, err := json.Marshal(d.Value); err == nil {
				msg += " (" + string(b) + ")"
			}
		}
	}
	if e.hint != "" {
		msg += " — " + e.hint
	}
	return strings.Join(strings.Fields(msg), " ")
}

// call sends method path (segments already escaped) with query and a JSON
// body (nil: none), decodes a 2xx answer into out (when not nil) and
// returns its bytes as sent. Anything else is an error of one line: the
// API's problem, or why relay serve could not be reached.
func (c *apiClient) call(ctx context.Context, method, path string, query url.Values, body, out any) ([]byte, error) {
	// Segments come escaped (a child run id's slash as %2F) and must reach
	// the server as written.
	u := *c.base
	u.RawPath = c.base.EscapedPath() + path
	p, err := url.PathUnescape(u.RawPath)
	if err != nil {
		return nil, err
	}
	u.Path = p
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json, application/problem+json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its text repeats the URL, query and all
		}
		return nil, fmt.Errorf("cannot reach relay serve at %s: %v", redactURL(c.base.String()), err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAPIResponse))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &apiError{status: resp.StatusCode}
		if json.Unmarshal(b, &e.problem) != nil || e.problem.Status == 0 {
			e.problem = huma.ErrorModel{}
			e.body = string(b)
			if len(e.body) > 200 {
				e.body = e.body[:200] + "…"
			}
		}
		if ra := resp.Header.Get("Retry-After"); ra != "" && len(ra) < 40 {
			e.hint = "retry after " + ra + "s"
			if _, err := strconv.Atoi(ra); err != nil {
				e.hint = "retry after " + ra
			}
		}
		if resp.StatusCode == http.StatusUnauthorized && c.token == "" {
			e.hint = "no token sent: set $" + apiTokenEnv + " or pass --token (relay token mints one)"
		}
		return nil, e
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return nil, fmt.Errorf("%s %s: the answer is not what relay serve answers (another server at %s?): %w", method, path, redactURL(c.base.String()), err)
		}
	}
	return b, nil
}

// segment escapes one path segment: a child run's id holds a slash, and
// a name of dots would otherwise be a path's "." or "..".
func segment(s string) string {
	if strings.Trim(s, ".") == "" {
		return strings.Repeat("%2E", len(s))
	}
	return url.PathEscape(s)
}
