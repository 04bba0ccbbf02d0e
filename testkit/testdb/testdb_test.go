package testdb

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestMain(m *testing.M) { Main(m) }

// connect waits out a server that refuses with "too many clients" (53300)
// and connects once a connection is freed; other errors return at once.
// The limit is a role's (superusers ignore connection limits), so the role
// must be able to log in without a password, as on the servers this
// package finds itself.
func TestConnectWaitsOutAFullServer(t *testing.T) {
	ctx := context.Background()
	u := URL(t)
	admin, err := connect(ctx, srv.adminURL)
	if err != nil {
		t.Fatal(err)
	}
	role := "relay_test_role_" + randHex(4)
	_, err = admin.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN CONNECTION LIMIT 1", role))
	admin.Close(ctx)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		t.Skipf("the test server's user may not create roles: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	// Roles belong to the whole server: drop it on a connection of its own,
	// whatever the test's outcome.
	t.Cleanup(func() {
		c, err := connect(ctx, srv.adminURL)
		if err != nil {
			t.Errorf("drop role %s: %v", role, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP ROLE IF EXISTS "+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p.User = url.User(role)
	limited := p.String()
	held, err := pgx.Connect(ctx, limited)
	if err != nil {
		t.Skipf("the server does not let a new role log in without a password: %v", err)
	}
	defer held.Close(ctx)
	if c, err := pgx.Connect(ctx, limited); err == nil {
		c.Close(ctx)
		t.Fatal("a second connection was accepted past CONNECTION LIMIT 1")
	}
	type result struct {
		c   *pgx.Conn
		err error
	}
	done := make(chan result, 1)
	go func() { c, err := connect(ctx, limited); done <- result{c, err} }()
	select {
	case r := <-done:
		t.Fatalf("connect returned while the role was at its limit: %v", r.err)
	case <-time.After(200 * time.Millisecond):
	}
	held.Close(ctx)
	r := <-done
	if r.err != nil {
		t.Fatalf("connect after a connection was freed: %v", r.err)
	}
	r.c.Close(ctx)

	if _, err := connect(ctx, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5"); err == nil {
		t.Fatal("connect to a closed port succeeded")
	}
}
