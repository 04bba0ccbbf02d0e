// Package testdb gives each test its own PostgreSQL database, cloned from a
// migrated template, so that test packages run in parallel and leave nothing
// behind.
//
// The server is, in order: RELAY_TEST_DATABASE_URL when set; else a
// throwaway cluster started from the local initdb/pg_ctl for the life of
// the test binary (one per test package, so that no package's connections
// count against another's, nor against a shared server's other users);
// else, only when PostgreSQL's server binaries are missing, a server
// answering on localhost:5432. Call Main from TestMain.
//
// Main also keeps the tests' logs to errors: the warnings a library logs on
// purpose while its faults are tested (a lost lease, a reconnect) otherwise
// bury the one failure. RELAY_TEST_LOG=warn (or info, debug) shows more.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/devpg"
)

// EnvURL names the variable that points the tests at a server. The URL must
// allow CREATE DATABASE.
const EnvURL = "RELAY_TEST_DATABASE_URL"

type server struct {
	adminURL string
	template string
}

var (
	// The server is per test binary: set up once by the first test that asks,
	// torn down by Main. (Test binaries are processes; this is not state a
	// library user could ever share.)
	once   sync.Once
	srv    *server
	srvErr error
	// cluster is the throwaway cluster this binary started, for Main to
	// stop.
	clusterMu sync.Mutex
	cluster   *devpg.Cluster
)

// Main runs the tests of a package and stops the throwaway cluster, if one
// was started, before exiting with the tests' code. (A binary that dies
// otherwise, by go test's -timeout, a panic or Ctrl-C, leaves it to the
// next throwaway cluster's start, which removes clusters whose process is
// gone. Main installs no signal handler: tests re-run their own binary as
// worker processes that must handle SIGTERM themselves.)
func Main(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: testLogLevel()})))
	code := m.Run()
	stopCluster()
	os.Exit(code)
}

// LogEnv names the variable that sets the level of the tests' default
// logger: error (the default), warn, info or debug.
const LogEnv = "RELAY_TEST_LOG"

// testLogLevel reads LogEnv; an unknown value is the default, with a note.
func testLogLevel() slog.Level {
	v := os.Getenv(LogEnv)
	if v == "" {
		return slog.LevelError
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(v)); err != nil {
		fmt.Fprintf(os.Stderr, "testdb: %s=%q is not a level (error, warn, info, debug): logging errors only\n", LogEnv, v)
		return slog.LevelError
	}
	return l
}

// stopCluster stops the throwaway cluster, if one was started.
func stopCluster() {
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		cluster = nil
	}
}

// startCluster starts the throwaway cluster and records it for stopCluster.
// Synchronous commit stays on, as on the servers Relay runs on: tests check
// what Relay itself sets per transaction. Autovacuum stays on, as on a
// real server (a client warns when it is off); a test whose plans depend on
// statistics of its own turns it off for its table.
func startCluster(ctx context.Context, maxConns int) (*devpg.Cluster, error) {
	c, err := devpg.Start(ctx, devpg.Options{Fast: true, SynchronousCommit: true, MaxConnections: maxConns})
	if err != nil {
		return nil, err
	}
	clusterMu.Lock()
	defer clusterMu.Unlock()
	cluster = c
	return c, nil
}

// MainOwnCluster is Main. (Every package now runs on a throwaway cluster
// of its own; the name stays for the packages that asked for one first.)
func MainOwnCluster(m *testing.M) { Main(m) }

// URL creates a fresh migrated database for the test and returns its URL; the
// database is dropped when the test ends.
func URL(t testing.TB) string {
	t.Helper()
	return create(t, true)
}

// EmptyURL is URL for a database without Relay's schema (for migration
// tests).
func EmptyURL(t testing.TB) string {
	t.Helper()
	return create(t, false)
}

func create(t testing.TB, migrated bool) string {
	t.Helper()
	once.Do(func() { srv, srvErr = setup() })
	if srvErr != nil {
		t.Fatalf("testdb: %v", srvErr)
	}
	ctx := context.Background()
	name := "relay_test_" + randHex(6)
	admin, err := connect(ctx, srv.adminURL)
	if err != nil {
		t.Fatalf("testdb: connect: %v", err)
	}
	defer admin.Close(ctx)
	tpl := srv.template
	if !migrated {
		tpl = "template0"
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tpl)); err != nil {
		t.Fatalf("testdb: clone template: %v", err)
	}
	t.Cleanup(func() {
		c, err := connect(ctx, srv.adminURL)
		if err != nil {
			t.Errorf("testdb: connect to drop %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name)); err != nil {
			t.Errorf("testdb: drop %s: %v", name, err)
		}
	})
	return withDatabase(srv.adminURL, name)
}

// New is URL with a pool on it, closed when the test ends (before the
// database is dropped).
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), URL(t))
	if err != nil {
		t.Fatalf("testdb: pool: %v", err)
	}
	t.Cleanup(func() { closePool(t, pool) })
	return pool
}

// closePool closes a test's pool, bounded: pgxpool's Close waits for every
// connection to be released, and one held by a transaction a failed test
// left open would hang the test binary until go test's timeout, the
// failure's message unprinted. The database is dropped WITH (FORCE) after.
func closePool(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	done := make(chan struct{})
	go func() { pool.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Errorf("testdb: the pool did not close within 30s: a connection is still held (a transaction left open?)")
	}
}

func setup() (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const local = "postgres://postgres@localhost:5432/postgres?sslmode=disable"
	s := &server{}
	switch {
	case os.Getenv(EnvURL) != "":
		s.adminURL = os.Getenv(EnvURL)
	default:
		// max_connections 500: the proofs' worker processes open up to
		// about 60 connections at once, beside the package's other tests.
		c, err := startCluster(ctx, 500)
		if err == nil {
			s.adminURL = c.URL
			break
		}
		if !errors.Is(err, devpg.ErrNoPostgres) || !answers(ctx, local) {
			return nil, fmt.Errorf("no PostgreSQL for the tests: %s is unset and a throwaway cluster could not start (nor does a server answer on localhost:5432): %w", EnvURL, err)
		}
		// Without initdb, a shared server is still better than no test.
		fmt.Fprintf(os.Stderr, "testdb: %v; using localhost:5432, where the test packages together may exhaust max_connections\n", err)
		s.adminURL = local
	}
	if err := s.ensureTemplate(ctx); err != nil {
		stopCluster()
		return nil, err
	}
	return s, nil
}

// answers says whether a server accepts a connection at u. A refused
// connection answers at once; the bound is for a server that is there but
// slow, as on a loaded CI machine starting many test binaries at once,
// which must not be mistaken for no server (the tests would then start a
// throwaway cluster of their own, or fail).
func answers(ctx context.Context, u string) bool {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		return false
	}
	c.Close(ctx)
	return true
}

// connect opens an admin connection, waiting out a server that is full:
// test binaries run in parallel on one server, and a moment when their
// connections together reach max_connections ("sorry, too many clients
// already", SQLSTATE 53300) passes as their tests end. It waits at most a
// minute, then returns the server's error.
func connect(ctx context.Context, u string) (*pgx.Conn, error) {
	deadline := time.Now().Add(time.Minute)
	wait := 50 * time.Millisecond
	for {
		c, err := pgx.Connect(ctx, u)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "53300" || time.Now().Add(wait).After(deadline) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// ensureTemplate makes relay_tpl_<fingerprint> once per schema version. Test
// binaries run in parallel, so creation is serialized by an advisory lock, and
// the template only gets its final name once fully migrated.
func (s *server) ensureTemplate(ctx context.Context) error {
	s.template = "relay_tpl_" + migrations.Fingerprint()
	admin, err := connect(ctx, s.adminURL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", redact(s.adminURL), err)
	}
	defer admin.Close(ctx)
	h := fnv.New64a()
	h.Write([]byte(s.template))
	key := int64(h.Sum64())
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return fmt.Errorf("lock template creation: %w", err)
	}
	defer admin.Exec(ctx, "SELECT pg_advisory_unlock($1)", key) //nolint:errcheck
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", s.template).Scan(&exists); err != nil {
		return fmt.Errorf("look for template: %w", err)
	}
	if exists {
		return nil
	}
	building := s.template + "_building"
	if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", building)); err != nil {
		return fmt.Errorf("drop stale template: %w", err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s", building)); err != nil {
		return fmt.Errorf("create template: %w", err)
	}
	pool, err := pgxpool.New(ctx, withDatabase(s.adminURL, building))
	if err != nil {
		return fmt.Errorf("connect to template: %w", err)
	}
	_, err = migrations.Migrate(ctx, pool)
	pool.Close()
	if err != nil {
		return fmt.Errorf("migrate template: %w", err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", building, s.template)); err != nil {
		return fmt.Errorf("name template: %w", err)
	}
	// Templates of other schema versions are left alone: another checkout of
	// the repository (a branch with other migrations) may be cloning from
	// one right now on the same server, and dropping it would fail its tests.
	return nil
}

func withDatabase(u, db string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	p.Path = "/" + db
	return p.String()
}

func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return p.Redacted()
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
