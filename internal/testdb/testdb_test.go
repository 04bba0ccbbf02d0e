package testdb

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
	defer admin.Close(ctx)
	role := "relay_test_role_" + randHex(4)
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN CONNECTION LIMIT 1", role)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(ctx, "DROP ROLE "+role) }) //nolint:errcheck
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
