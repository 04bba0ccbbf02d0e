package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/appname"
	"github.com/relayq/relay/migrations"
)

// openPool opens a pool on a PostgreSQL URL and checks, once, that the
// database answers: a URL of another database (mysql://…) is refused by
// its scheme, and an unreachable server is one line naming the address.
// With needSchema, a database with migrations pending is refused too
// (migrations.ErrNotMigrated, naming `relay migrate`).
func openPool(ctx context.Context, rawURL string, needSchema bool) (*pgxpool.Pool, error) {
	return openPoolAs(ctx, rawURL, "", needSchema)
}

// openPoolAs is openPool whose connections name themselves for role
// (appname.For: "relay-serve", after the URL's own application_name) when
// role is not empty.
func openPoolAs(ctx context.Context, rawURL, role string, needSchema bool) (*pgxpool.Pool, error) {
	if err := checkScheme(rawURL); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, err
	}
	if role != "" {
		rp := cfg.ConnConfig.RuntimeParams
		rp["application_name"] = appname.For(rp["application_name"], role, "")
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := pool.Ping(cctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach the database: %s", oneLine(err))
	}
	if needSchema {
		if err := migrations.Check(cctx, pool); err != nil {
			pool.Close()
			if errors.Is(err, migrations.ErrNotMigrated) {
				return nil, err
			}
			return nil, fmt.Errorf("ask the database for its schema version: %s", oneLine(err))
		}
	}
	return pool, nil
}

// checkScheme refuses a URL whose scheme is not PostgreSQL's, naming the
// scheme (and never echoing the rest, which may hold a password). A
// key=value connection string has no scheme and passes.
func checkScheme(rawURL string) error {
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		return nil
	}
	if u, err := url.Parse(rawURL); err == nil && u.Scheme != "" {
		scheme = u.Scheme
	}
	return fmt.Errorf("the database URL is a %q URL: Relay needs PostgreSQL (postgres://user:password@host:5432/dbname)", scheme)
}

// oneLine joins a multi-line error (pgx lists every address it tried on a
// line of its own) into one line, without repeating a line.
func oneLine(err error) string {
	var parts []string
	seen := map[string]bool{}
	for _, l := range strings.Split(err.Error(), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || seen[l] {
			continue
		}
		seen[l] = true
		parts = append(parts, l)
	}
	return strings.Join(parts, " ")
}
