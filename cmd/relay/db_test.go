package main

import (
	"context"
	"testing"

	"github.com/relayq/relay/testkit/testdb"
)

// relay serve's connections name themselves relay-serve, after the URL's
// own application_name.
func TestServePoolNamesItself(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := openPoolAs(ctx, testdb.URL(t)+"&application_name=ops", "serve", false)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var name string
	if err := pool.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&name); err != nil || name != "ops relay-serve" {
		t.Fatalf("application_name %q (%v), want %q", name, err, "ops relay-serve")
	}
}
