// Package admin is Relay's admin API: an http.Handler over jobs, queues,
// schedules, the outbox, idempotency keys and the audit log, for an operator
// who needs to find a dead job, read why it died and requeue it — safely,
// with nobody else able to.
//
// Every request is authenticated by a bearer JWT (see Auth) and authorised by
// scope: relay:read for every GET, relay:write for every change. Every change
// writes a row to the audit log in the same transaction. Every error is an
// RFC 9457 application/problem+json body, including unknown routes (404) and
// wrong methods (405). The OpenAPI 3.1 document is served at /openapi.json;
// it is generated from the handlers' Go types by huma, so it cannot drift
// from them.
//
// Changes go through the public APIs of core (Cancel, Requeue, PauseQueue,
// ResumeQueue) and scheduler (Pause, Resume, TriggerNow); reads and the few
// changes those packages have no call for (retry now, delete a finished job,
// redispatch an outbox event, delete an idempotency key) are statements of
// its own, all in admin/queries.go, but for the live processes, read with
// the one set of statements of relay_processes (internal/liveness). No
// database row type crosses the API boundary.
package admin

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/admin/ui"
	"github.com/relayq/relay/outbox"
)

// Config configures Handler. Auth (or NoAuth) is needed; the zero value of
// every other field is a sensible default.
type Config struct {
	// Auth verifies bearer tokens. Required unless NoAuth is set.
	Auth *Auth
	// NoAuth serves every request without a token, as subject "anonymous"
	// with every scope. Only for a handler reachable from loopback alone;
	// relay serve refuses it on any other address. Such a handler answers
	// only requests addressed to a loopback host and refuses changes from
	// web pages of other origins (see loopbackGuard).
	NoAuth bool
	// Deprecated: /v1/outbox/subscriptions lists the subscriptions the
	// dispatchers stored in the database (outbox.ListSubscriptions); this
	// field is not read.
	Subscriptions []outbox.Subscription
	// BulkBatchSize caps the jobs a bulk operation changes per transaction.
	// Default 500.
	BulkBatchSize int
	// BulkTimeBudget is how long a bulk operation keeps starting batches;
	// when it runs out the answer says done: false, with the counts so far,
	// and running the operation again continues. Default 20s.
	BulkTimeBudget time.Duration
	// RequestTimeout bounds every request's work. Default 60s.
	RequestTimeout time.Duration
	// LockTimeout bounds how long a change waits for a row another
	// transaction holds (a worker finishing the job): a one-job change then
	// answers 409, a bulk operation skips the job. Default 2s.
	LockTimeout time.Duration
	// TraceURL, when set, makes each traced job link to its trace: the URL
	// with {trace_id} replaced ("http://jaeger:16686/trace/{trace_id}").
	TraceURL string
	// Logger receives unexpected errors. Default slog.Default().
	Logger *slog.Logger
	// DashboardLogin, when set, lets the dashboard exchange one-time login
	// codes for tokens (relay serve's login link on loopback).
	DashboardLogin *ui.OneTimeLogin
	// ReadPool, when set, serves the reads that may lag behind the primary:
	// lists, counts and charts (jobs, workflows and their children,
	// queues, schedules and their fires, the outbox and its blocked keys,
	// the audit log). It is meant for a streaming replica of the primary.
	// Every change, everything a change reads, and every read of one
	// object by its id or name (a job, a run, an idempotency key: what a
	// page shows again after a change) stay on the pool given to Handler,
	// so they see the changes just made. GET /v1/replica reports how far
	// the replica is behind. Default: every read on the primary's pool.
	ReadPool *pgxpool.Pool
	// RateLimit, when above zero, bounds each bearer token's requests per
	// second (a token bucket per token, after the token verified; with
	// NoAuth, one bucket for every request). A request over the limit is
	// answered 429 with Retry-After, before its body is read or any SQL
	// runs. Default 0: no limit.
	RateLimit float64
	// RateBurst is how many requests a token may make at once before
	// RateLimit paces it. Default twice RateLimit, at least 10 (a
	// dashboard page makes a few calls at once).
	RateBurst int
}

// Version is the API's version in its OpenAPI document.
const Version = "1.0.0"

// maxBodyBytes bounds every request body; a larger one is refused with 413.
const maxBodyBytes = 64 << 10

// server holds what every handler needs.
type server struct {
	pool     *pgxpool.Pool
	read     *pgxpool.Pool // ReadPool, or pool
	cfg      Config
	log      *slog.Logger
	verifier *verifier
	limiter  *rateLimiter // nil: no rate limit
}

// Handler returns the admin API as an http.Handler, to serve on its own (relay
// serve) or to mount in a service's mux (with http.StripPrefix when mounted
// under a path). It fails when cfg asks for no authentication without saying
// so, or when the auth configuration is unusable.
func Handler(pool *pgxpool.Pool, cfg *Config) (http.Handler, error) {
	h, _, err := newAPI(pool, cfg)
	if err == nil && cfg.NoAuth {
		h = newLoopbackGuard(h)
	}
	return h, err
}

// newAPI builds the handler and returns its huma API too (tests read its
// OpenAPI document).
func newAPI(pool *pgxpool.Pool, cfg *Config) (http.Handler, huma.API, error) {
	if pool == nil {
		return nil, nil, errors.New("admin: nil pool")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c.BulkBatchSize = cmp.Or(c.BulkBatchSize, 500)
	c.BulkTimeBudget = cmp.Or(c.BulkTimeBudget, 20*time.Second)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, 60*time.Second)
	c.LockTimeout = cmp.Or(c.LockTimeout, 2*time.Second)
	s := &server{pool: pool, read: cmp.Or(c.ReadPool, pool), cfg: c, log: cmp.Or(c.Logger, slog.Default())}
	switch {
	case c.Auth != nil && c.NoAuth:
		return nil, nil, errors.New("admin: both Auth and NoAuth set")
	case c.Auth != nil:
		v, err := newVerifier(c.Auth)
		if err != nil {
			return nil, nil, err
		}
		s.verifier = v
	case !c.NoAuth:
		return nil, nil, errors.New("admin: no Auth configured (set NoAuth to serve without authentication)")
	}
	switch {
	case c.RateLimit < 0 || math.IsNaN(c.RateLimit) || math.IsInf(c.RateLimit, 0):
		return nil, nil, fmt.Errorf("admin: RateLimit %v: want requests per second above 0, or 0 for no limit", c.RateLimit)
	case c.RateBurst < 0:
		return nil, nil, fmt.Errorf("admin: RateBurst %d: want 0 (the default) or more", c.RateBurst)
	case c.RateLimit > 0:
		s.limiter = newRateLimiter(c.RateLimit, cmp.Or(c.RateBurst, max(10, int(math.Ceil(2*c.RateLimit)))))
	}
	if c.TraceURL != "" && !strings.Contains(c.TraceURL, "{trace_id}") {
		return nil, nil, errors.New("admin: TraceURL must contain {trace_id}")
	}

	mux := http.NewServeMux()
	hc := huma.DefaultConfig("Relay admin API", Version)
	hc.Info.Description = "Jobs, queues, schedules, outbox and idempotency keys of a Relay database. " +
		"GET needs scope relay:read, every change relay:write. Errors are RFC 9457 problem+json."
	hc.DocsPath = ""     // the docs page loads scripts from a CDN; the document is enough
	hc.SchemasPath = ""  // schemas are inline in /openapi.json
	hc.CreateHooks = nil // no $schema links in bodies: a body is exactly its type
	hc.RejectUnknownQueryParameters = true
	hc.Formats = map[string]huma.Format{"application/json": strictJSON, "json": strictJSON}
	hc.Components.SecuritySchemes = map[string]*huma.SecurityScheme{
		"bearer": {Type: "http", Scheme: "bearer", BearerFormat: "JWT",
			Description: "A JWT with scope relay:read (GETs) and/or relay:write (changes)."},
	}
	hc.Transformers = append(hc.Transformers, problemTransformer)
	api := humago.New(mux, hc)
	api.UseMiddleware(s.authenticate(api))

	s.registerJobs(api)
	s.registerQueues(api)
	s.registerSchedules(api)
	s.registerOutbox(api)
	s.registerIdempotency(api)
	s.registerAudit(api)
	s.registerWhoami(api)
	s.registerWorkflows(api)
	s.registerHistory(api)
	s.registerReplica(api)
	s.registerProcesses(api)
	mountUI(mux, &ui.Options{Login: c.DashboardLogin})
	return problemRouter{mux: mux}, api, nil
}

// op is the common shape of every operation: its id, method, path, summary,
// tags, the bearer requirement with its scope, and the body bound.
func op(id, method, path, summary, tag string) huma.Operation {
	scope := ScopeWrite
	errs := []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound,
		http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity, http.StatusTooManyRequests}
	if method == http.MethodGet {
		scope = ScopeRead
		errs = []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusUnprocessableEntity,
			http.StatusTooManyRequests}
	}
	return huma.Operation{
		OperationID:  id,
		Method:       method,
		Path:         path,
		Summary:      summary,
		Tags:         []string{tag},
		Security:     []map[string][]string{{"bearer": {scope}}},
		MaxBodyBytes: maxBodyBytes,
		Errors:       errs, // every status the handlers and the middleware answer besides 200 (and 500)
	}
}

// internalError logs an unexpected error and returns a 500 problem that
// does not leak it. A problem a change returned from inside its
// transaction passes through; a lock wait that ran out (another
// transaction holds the row) is no fault of the server: a 409 to try again.
func (s *server) internalError(what string, err error) error {
	var se huma.StatusError
	if errors.As(err, &se) {
		return se
	}
	if isLockTimeout(err) {
		return huma.Error409Conflict(fmt.Sprintf("%s: a row it changes is locked by another transaction "+
			"(a worker finishing a job?) for longer than %s; try again", what, s.cfg.LockTimeout))
	}
	s.log.Error("admin: "+what, "err", err)
	return huma.Error500InternalServerError(fmt.Sprintf("%s failed; see the server log", what))
}

// mountUI serves the dashboard (package ui) under /ui/, and sends / and /ui
// there. The dashboard's files are public; its pages call the API with the
// operator's token like any other client. The redirects are relative, so
// they work when the handler is mounted under a prefix.
func mountUI(mux *http.ServeMux, o *ui.Options) {
	h := ui.Handler(o)
	mux.Handle("GET /ui/", h)
	if o.Login != nil {
		mux.Handle("POST /ui/login", h)
	}
	to := func(loc string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", loc)
			w.WriteHeader(http.StatusFound)
		})
	}
	mux.Handle("GET /ui", to("ui/"))
	mux.Handle("GET /{$}", to("ui/"))
}
