package admin

import (
	"encoding/json"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/danielgtaylor/huma/v2"
)

// problemTransformer fills the RFC 9457 members huma leaves empty: type
// (about:blank: the status says it all) and instance (the request's path).
func problemTransformer(ctx huma.Context, status string, v any) (any, error) {
	if p, ok := v.(*huma.ErrorModel); ok {
		if p.Type == "" {
			p.Type = "about:blank"
		}
		if p.Instance == "" {
			u := ctx.URL()
			p.Instance = u.Path
		}
	}
	return v, nil
}

// problemRouter is the mux with problem+json for the requests it has no
// operation for: 404 for an unknown path, 405 (with Allow) for a known path
// with another method.
type problemRouter struct{ mux *http.ServeMux }

func (p problemRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !cleanText(r.URL.Path) || !cleanText(queryText(r)) {
		writeProblem(w, r, http.StatusBadRequest, "the path or query holds a NUL byte or invalid UTF-8")
		return
	}
	h, pattern := p.mux.Handler(r)
	if pattern != "" {
		p.mux.ServeHTTP(w, r)
		return
	}
	// Ask the mux what it would have said, without letting it say it.
	rec := &headerRecorder{header: http.Header{}}
	h.ServeHTTP(rec, r)
	switch rec.status {
	case http.StatusMethodNotAllowed:
		w.Header().Set("Allow", rec.header.Get("Allow"))
		writeProblem(w, r, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path)
	case http.StatusNotFound, 0:
		writeProblem(w, r, http.StatusNotFound, "no such route: "+r.URL.Path)
	default: // a redirect to the cleaned path
		p.mux.ServeHTTP(w, r)
	}
}

// writeProblem writes a problem body outside huma (routing errors, health).
func writeProblem(w http.ResponseWriter, r *http.Request, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(huma.ErrorModel{ //nolint:errcheck // the client has gone if this fails
		Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail, Instance: r.URL.Path,
	})
}

// headerRecorder records a response's status and headers and drops its body.
type headerRecorder struct {
	header http.Header
	status int
}

func (h *headerRecorder) Header() http.Header         { return h.header }
func (h *headerRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (h *headerRecorder) WriteHeader(code int)        { h.status = code }

// cleanText reports whether s can be a PostgreSQL text value: valid UTF-8
// without NUL bytes. Anything else would fail in the database as a 500.
func cleanText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// queryText is every decoded query key and value, joined.
func queryText(r *http.Request) string {
	var b strings.Builder
	for k, vs := range r.URL.Query() {
		b.WriteString(k)
		for _, v := range vs {
			b.WriteString(v)
		}
	}
	return b.String()
}
