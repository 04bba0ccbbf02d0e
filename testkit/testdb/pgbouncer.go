package testdb

import (
	"context"
	"errors"
	"net/url"
	"os"
	"testing"

	"github.com/relayq/relay/testkit/devpg"
)

// PgBouncer starts a PgBouncer on a loopback port in front of the tests'
// server, stopped when the test ends, and returns it; Through turns a test
// database's URL into the same database through it. Without a pgbouncer
// binary the test is skipped, saying how to install one, except under
// CI=true, where it fails: CI installs PgBouncer, so a missing binary there
// is a broken setup, not a reason to skip.
func PgBouncer(t testing.TB, opts devpg.BouncerOptions) *devpg.Bouncer {
	t.Helper()
	once.Do(func() { srv, srvErr = setup() })
	if srvErr != nil {
		t.Fatalf("testdb: %v", srvErr)
	}
	if _, err := devpg.BouncerBin(); errors.Is(err, devpg.ErrNoPgBouncer) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("testdb: %v (CI=true: CI must install it)", err)
		}
		t.Skipf("testdb: %v", err)
	}
	b, err := devpg.StartBouncer(context.Background(), srv.adminURL, opts)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Errorf("testdb: stop pgbouncer: %v", err)
		}
	})
	return b
}

// Through is dbURL (a database of this server, from URL or EmptyURL) with
// its host and port replaced by the bouncer's.
func Through(b *devpg.Bouncer, dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return dbURL
	}
	bu, err := url.Parse(b.URL)
	if err != nil {
		return dbURL
	}
	u.Host = bu.Host
	return u.String()
}
