package admin

import (
	"net"
	"net/http"
	"strings"
)

// loopbackGuard protects a handler served without authentication
// (Config.NoAuth) from the web pages its operator's browser opens. Being
// reachable from loopback alone is not enough: a page from any origin can
// POST to http://127.0.0.1:8080/… (a form needs no preflight), and a page
// whose DNS name is rebound to 127.0.0.1 reads the answers as its own. So a
// request must name a loopback host (Host: 127.0.0.1, [::1], localhost —
// a rebound page sends its own name), and a change must not come from
// another origin (net/http's CrossOriginProtection: Sec-Fetch-Site, else
// Origin against Host). Tools such as curl send neither header and pass.
type loopbackGuard struct {
	next http.Handler
	csrf *http.CrossOriginProtection
}

func newLoopbackGuard(next http.Handler) loopbackGuard {
	return loopbackGuard{next: next, csrf: http.NewCrossOriginProtection()}
}

// LoopbackGuard wraps a handler served without authentication next to a
// Config.NoAuth admin handler (metrics, health probes) in the guard that
// handler applies to itself: it answers only requests addressed to a
// loopback host, and refuses changes sent by web pages of other origins,
// each with a 403 problem.
func LoopbackGuard(next http.Handler) http.Handler { return newLoopbackGuard(next) }

func (g loopbackGuard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !loopbackHost(r.Host) {
		writeProblem(w, r, http.StatusForbidden, "this API runs without authentication and answers only requests "+
			"addressed to a loopback host (127.0.0.1, [::1], localhost), not "+r.Host)
		return
	}
	if err := g.csrf.Check(r); err != nil {
		writeProblem(w, r, http.StatusForbidden, "this API runs without authentication and refuses changes "+
			"sent by a web page of another origin")
		return
	}
	g.next.ServeHTTP(w, r)
}

// loopbackHost reports whether a Host header (host or host:port) names a
// loopback address or localhost.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
