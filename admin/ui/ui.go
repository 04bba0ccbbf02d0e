// Package ui is Relay's dashboard: static HTML, CSS and a few hand-written
// JavaScript modules, embedded in the binary and served under /ui/ next to
// the admin API. The pages call the admin API (/v1/...) with the bearer
// token the operator pasted, kept in the browser's session storage, so the
// dashboard can do nothing the token may not: the server side serves files
// only, with no session and no access to the database.
//
// Nothing is fetched from the internet at run time: no CDN, no web fonts.
// There is no JavaScript build step; the files under static/ are what the
// browser runs.
package ui

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed static
var static embed.FS

// Options configures Handler. The zero value serves the dashboard, with
// sign-in by a pasted token only.
type Options struct {
	// Login, when set, exchanges one-time login codes for tokens at POST
	// /ui/login (relay serve's login link on loopback).
	Login *OneTimeLogin
}

// csp allows the page its own scripts, styles and API calls, and nothing
// else: no inline script, no third-party origin, no framing.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the dashboard for requests whose path starts with /ui/
// (mount it at "/ui/" of the admin API's mux, which is what admin.Handler
// does).
func Handler(opts *Options) http.Handler {
	var o Options
	if opts != nil {
		o = *opts
	}
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if r.URL.Path == "/ui/login" && r.Method == http.MethodPost && o.Login != nil {
			o.Login.serveLogin(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			problem(w, r, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path)
			return
		}
		switch {
		case strings.HasSuffix(r.URL.Path, "/") && r.URL.Path != "/ui/": // no directory listings
			problem(w, r, http.StatusNotFound, "no such page: "+r.URL.Path)
		case strings.HasPrefix(r.URL.Path, "/ui/"):
			// A missing file is a problem, as everywhere else in the API,
			// not the file server's text/plain 404.
			name := strings.TrimPrefix(r.URL.Path, "/ui/")
			if name == "" {
				name = "index.html"
			}
			if st, err := fs.Stat(sub, name); err != nil || st.IsDir() {
				problem(w, r, http.StatusNotFound, "no such page: "+r.URL.Path)
				return
			}
			files.ServeHTTP(w, r)
		default:
			problem(w, r, http.StatusNotFound, "no such page: "+r.URL.Path)
		}
	})
}
