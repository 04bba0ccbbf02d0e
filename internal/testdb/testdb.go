// Package testdb gives each test its own PostgreSQL database, cloned from a
// migrated template, so that test packages run in parallel and leave nothing
// behind.
//
// The server is, in order: RELAY_TEST_DATABASE_URL when set; a server
// answering on localhost:5432; or a throwaway cluster started from the local
// initdb/pg_ctl for the life of the test binary. Call Main from TestMain;
// a package whose tests open many connections (worker processes) calls
// MainOwnCluster instead, and takes a throwaway cluster over the shared
// server (which it uses only when no cluster can start for want of
// initdb).
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/devpg"
	"github.com/relayq/relay/migrations"
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
	// ownCluster is set by MainOwnCluster before any test runs.
	ownCluster bool
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
	code := m.Run()
	stopCluster()
	os.Exit(code)
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
func startCluster(ctx context.Context, maxConns int) (*devpg.Cluster, error) {
	c, err := devpg.Start(ctx, devpg.Options{Fast: true, MaxConnections: maxConns})
	if err != nil {
		return nil, err
	}
	clusterMu.Lock()
	defer clusterMu.Unlock()
	cluster = c
	return c, nil
}

// MainOwnCluster is Main for a package whose tests open many connections at
// once (the proofs' worker processes: up to 60 for the workflow proof
// alone). Its tests run on a throwaway cluster of their own
// (max_connections 500) rather than on a server answering on
// localhost:5432, which the other test binaries share while they run in
// parallel: there, with a default max_connections of 100, its peak beside
// theirs made the server refuse connections ("sorry, too many clients
// already") and tests fail at random. RELAY_TEST_DATABASE_URL, when set,
// still wins; without PostgreSQL's server binaries it falls back to
// localhost:5432, with a warning.
func MainOwnCluster(m *testing.M) {
	ownCluster = true
	Main(m)
}

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
	case ownCluster:
		c, err := startCluster(ctx, 500)
		if err == nil {
			s.adminURL = c.URL
			break
		}
		if !errors.Is(err, devpg.ErrNoPostgres) || !answers(context.Background(), local) {
			return nil, fmt.Errorf("no PostgreSQL for the tests: %s is unset and a throwaway cluster could not start: %w", EnvURL, err)
		}
		// Without initdb, the shared server is still better than no test.
		fmt.Fprintf(os.Stderr, "testdb: %v; using localhost:5432, where these tests may exhaust max_connections\n", err)
		s.adminURL = local
	case answers(ctx, local):
		s.adminURL = local
	default:
		c, err := startCluster(ctx, 200)
		if err != nil {
			return nil, fmt.Errorf("no PostgreSQL for the tests: %s is unset, nothing answers on localhost:5432, and a throwaway cluster could not start: %w", EnvURL, err)
		}
		s.adminURL = c.URL
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
