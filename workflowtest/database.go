package workflowtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// CreateDatabase creates an empty database for one test on the server that
// serverURL (a postgres:// URL of any database there, whose role may
// CREATE DATABASE) reaches, and returns its URL, for New. The database is
// dropped when the test ends. Tests that each make their own run in
// parallel:
//
//	env := workflowtest.New(t, workflowtest.CreateDatabase(t, os.Getenv("TEST_DATABASE_URL")), nil)
func CreateDatabase(t testing.TB, serverURL string) string {
	t.Helper()
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("workflowtest: create a database: want a postgres:// URL of the server, got %q", redact(serverURL))
	}
	var b [6]byte
	rand.Read(b[:]) //nolint:errcheck // crypto/rand does not fail
	name := "relay_wftest_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		t.Fatalf("workflowtest: create a database: connect to %s: %v", redact(serverURL), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("workflowtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, serverURL)
		if err != nil {
			t.Errorf("workflowtest: drop database %s: connect: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("workflowtest: drop database %s: %v", name, err)
		}
	})
	d := *u
	d.Path = "/" + name
	d.RawPath = ""
	return d.String()
}

// redact is u without its password, for messages.
func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return strings.SplitN(u, " ", 2)[0]
	}
	if _, ok := p.User.Password(); ok {
		p.User = url.UserPassword(p.User.Username(), "xxxxx")
	}
	return p.String()
}
