package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/relayq/relay/admin"
	"github.com/relayq/relay/admin/ui"
	"github.com/relayq/relay/core"
	"github.com/relayq/relay/internal/appname"
	"github.com/relayq/relay/internal/liveness"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/telemetry"
)

// runServe serves the admin API, /metrics, /healthz and /readyz until ctx
// ends (SIGINT/SIGTERM), then shuts down gracefully.
func runServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	url := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL")
	readURL := fs.String("read-database-url", os.Getenv("RELAY_READ_DATABASE_URL"), "PostgreSQL URL of a streaming replica for the admin API's lists, counts and charts (changes and reads of one object stay on --database-url)")
	listen := fs.String("listen", "127.0.0.1:8080", "address to listen on")
	issuer := fs.String("issuer", defaultIssuer, "required iss claim of tokens")
	audience := fs.String("audience", defaultAudience, "required aud claim of tokens")
	jwks := fs.String("jwks-file", "", "JWKS file of RS256/ES256 public keys (instead of $"+secretEnv+")")
	noAuth := fs.Bool("no-auth", false, "serve without authentication (loopback addresses only)")
	traceURL := fs.String("trace-url", "", "link each traced job to its trace: a URL with {trace_id}, e.g. http://localhost:16686/trace/{trace_id}")
	noLoginLink := fs.Bool("no-login-link", false, "do not print the dashboard's one-time login link (printed on loopback with $"+secretEnv+")")
	demoWorkers := fs.Bool("demo-workers", false, "also run workers for the demo's jobs, with demo.doomed fixed (the README walkthrough)")
	rateLimit := fs.Float64("rate-limit", 0, "requests per second each token may make (a burst of twice that, at least 10; over it: 429 with Retry-After); 0: no limit")
	allowUnmigrated := fs.Bool("allow-unmigrated", false, "serve even when the database has migrations pending (its calls fail until `relay migrate` runs)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *url == "" {
		return errors.New("serve: no database: pass --database-url or set $DATABASE_URL")
	}
	cfg := &admin.Config{Logger: slog.Default(), TraceURL: *traceURL, RateLimit: *rateLimit}
	secret := os.Getenv(secretEnv)
	switch {
	case *jwks != "" && secret != "":
		return errors.New("serve: both $" + secretEnv + " and --jwks-file are set: choose one (unset $" + secretEnv + " to verify tokens with the JWKS)")
	case *jwks != "":
		cfg.Auth = &admin.Auth{Issuer: *issuer, Audience: *audience, JWKSFile: *jwks}
	case secret != "":
		cfg.Auth = &admin.Auth{Issuer: *issuer, Audience: *audience, HS256Secret: []byte(secret)}
	case *noAuth:
		cfg.NoAuth = true
	default:
		return errors.New("serve: no authentication configured: set $" + secretEnv + " (HS256), pass --jwks-file, or --no-auth on a loopback address")
	}
	if cfg.Auth != nil && *noAuth {
		return errors.New("serve: --no-auth given with authentication configured")
	}
	if cfg.NoAuth && !loopbackOnly(ctx, *listen, net.DefaultResolver.LookupIPAddr) {
		return fmt.Errorf("serve: refusing to listen on %s without authentication (only loopback addresses may use --no-auth)", *listen)
	}

	// On loopback with an HS256 secret, the dashboard can be opened by a
	// one-time login link: a short-lived code, exchanged once for a token.
	var login *ui.OneTimeLogin
	if secret != "" && cfg.Auth != nil && cfg.Auth.HS256Secret != nil && loopbackOnly(ctx, *listen, net.DefaultResolver.LookupIPAddr) && !*noLoginLink {
		login = ui.NewOneTimeLogin(func() (string, error) {
			return admin.MintToken([]byte(secret), admin.TokenOpts{Issuer: *issuer, Audience: *audience,
				Subject: "dashboard-login", TTL: 8 * time.Hour})
		})
		cfg.DashboardLogin = login
	}

	pool, err := openPoolAs(ctx, *url, "serve", !*allowUnmigrated)
	if errors.Is(err, migrations.ErrNotMigrated) {
		return fmt.Errorf("serve: %w (or pass --allow-unmigrated to serve anyway)", err)
	}
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer pool.Close()
	if *readURL != "" {
		readCfg, err := pgxpool.ParseConfig(*readURL)
		if err != nil {
			return fmt.Errorf("serve: --read-database-url: %w", err)
		}
		rp := readCfg.ConnConfig.RuntimeParams
		rp["application_name"] = appname.For(rp["application_name"], "serve", "")
		read, err := pgxpool.NewWithConfig(ctx, readCfg)
		if err != nil {
			return fmt.Errorf("serve: --read-database-url: %w", err)
		}
		defer read.Close()
		cfg.ReadPool = read
	}
	api, err := admin.Handler(pool, cfg)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	mp, metrics, err := telemetry.Prometheus()
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer mp.Shutdown(context.WithoutCancel(ctx)) //nolint:errcheck // nothing left to report to

	if *demoWorkers {
		stop, err := startDemoWorkers(ctx, pool, mp)
		if err != nil {
			return fmt.Errorf("serve: demo workers: %w", err)
		}
		defer stop()
	}

	// Without authentication, /metrics and the probes answer loopback
	// hosts only, as the API itself does (admin.Handler guards itself).
	guard := func(h http.Handler) http.Handler {
		if cfg.NoAuth {
			return admin.LoopbackGuard(h)
		}
		return h
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", guard(metrics))
	mux.Handle("GET /healthz", guard(admin.Healthz()))
	mux.Handle("GET /readyz", guard(admin.Readyz(pool)))
	mux.Handle("/", api)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		// Longer than admin's RequestTimeout (60s): a request that runs
		// out of it still gets its problem body, not a dropped connection.
		WriteTimeout: 75 * time.Second,
		IdleTimeout:  2 * time.Minute,
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	// The address actually bound decides, whatever a name resolved to a
	// moment ago.
	if tcp, ok := ln.Addr().(*net.TCPAddr); cfg.NoAuth && (!ok || !tcp.IP.IsLoopback()) {
		ln.Close() //nolint:errcheck // refusing to serve
		return fmt.Errorf("serve: refusing to serve %s (bound for %s) without authentication (only loopback addresses may use --no-auth)", ln.Addr(), *listen)
	}
	stopEntry := recordServe(ctx, pool, ln.Addr().String())
	defer stopEntry()
	auth := "JWT (" + *issuer + ", " + *audience + ")"
	if cfg.NoAuth {
		auth = "NO AUTHENTICATION (loopback only)"
	}
	fmt.Printf("relay serve: admin API on http://%s (auth: %s); /openapi.json, /metrics, /healthz, /readyz\n", ln.Addr(), auth)
	fmt.Printf("relay serve: dashboard on http://%s/ui/\n", ln.Addr())
	if login != nil {
		fmt.Printf("relay serve: one-time dashboard login link (valid 10 minutes, once): http://%s/ui/#login=%s\n", ln.Addr(), login.NewCode(10*time.Minute))
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		return fmt.Errorf("serve: shutdown: %w", err)
	}
	return nil
}

// loopbackOnly reports whether addr (host:port) listens on loopback only.
// An empty host (":8080") or an unspecified address listens on every
// interface. A host name counts only when every address lookup resolves
// it to is loopback — "localhost" too, since /etc/hosts decides what it
// means. runServe checks the bound address again after listening.
func loopbackOnly(ctx context.Context, addr string, lookup func(context.Context, string) ([]net.IPAddr, error)) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := lookup(ctx, host)
	if err != nil || len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		if !ip.IP.IsLoopback() {
			return false
		}
	}
	return true
}

// startDemoWorkers runs the demo's workers on queue "demo", with the
// always-failing demo.doomed fixed (its card now goes through), so that a
// dead demo job requeued through the API succeeds. It returns the stop.
func startDemoWorkers(ctx context.Context, pool *pgxpool.Pool, mp metric.MeterProvider) (func(), error) {
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[greetArgs](func(ctx context.Context, j *core.Job[greetArgs]) error { return nil }))
	core.MustAddWorker(ws, core.WorkFunc[flakyArgs](func(ctx context.Context, j *core.Job[flakyArgs]) error {
		if j.Attempt <= j.Args.FailTimes {
			return fmt.Errorf("upstream unavailable (attempt %d)", j.Attempt)
		}
		return nil
	}))
	core.MustAddWorker(ws, core.WorkFunc[doomedArgs](func(ctx context.Context, j *core.Job[doomedArgs]) error {
		fmt.Printf("relay serve: demo worker: job %d %s attempt %d succeeds (the card goes through now)\n", j.ID, j.Kind, j.Attempt)
		return nil
	}))
	client, err := core.NewClient(pool, &core.Config{
		Workers:       ws,
		Queues:        map[string]core.QueueConfig{"demo": {MaxWorkers: 4}},
		MeterProvider: mp,
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		return nil, err
	}
	if err := client.Start(ctx); err != nil {
		return nil, err
	}
	return func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		client.Stop(stopCtx) //nolint:errcheck // shutting down
	}, nil
}

// recordServe records the server among the live processes (GET
// /v1/processes lists it, role serve, named by its address) and keeps the
// entry until the returned stop, which deletes it. A database the entry
// cannot be written to (served with --allow-unmigrated) costs the entry
// only, said once.
func recordServe(ctx context.Context, pool *pgxpool.Pool, addr string) (stop func()) {
	proc, err := liveness.New(pool, liveness.Entry{Role: liveness.RoleServe, Name: addr})
	if err == nil {
		err = proc.Register(ctx, pool)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "relay serve: not listed among the live processes: %v\n", err)
		return func() {}
	}
	keepCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); proc.Keep(keepCtx, slog.Default()) }()
	return func() {
		cancel()
		<-done
		if err := proc.Unregister(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "relay serve: %v (the entry ages out)\n", err)
		}
	}
}
