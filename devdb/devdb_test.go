package devdb_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/devdb"
	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// A schema is created, migrated, and reset on the next Open, which says so.
func TestOpenResetsTheSchema(t *testing.T) {
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	for i := range 2 {
		var out bytes.Buffer
		db, err := devdb.Open(ctx, devdb.Options{URL: url, Schema: "relay_example_x", Out: &out})
		if err != nil {
			t.Fatal(err)
		}
		var jobs int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM relay_example_x.relay_jobs`).Scan(&jobs); err != nil || jobs != 0 {
			t.Fatalf("run %d: %d jobs in a fresh schema (%v)", i, jobs, err)
		}
		if _, err := db.Pool.Exec(ctx, `INSERT INTO relay_jobs (kind, args) VALUES ('x', '{}')`); err != nil {
			t.Fatal(err)
		}
		db.Close()
		if said := strings.Contains(out.String(), "left from a previous run"); said != (i == 1) {
			t.Errorf("run %d said %q", i, out.String())
		}
	}
	if _, err := devdb.Open(ctx, devdb.Options{URL: url, Schema: "Robert'); DROP"}); err == nil {
		t.Error("a schema name that is not an identifier was accepted")
	}
}

// Examples are code to copy: they import nothing a user's module cannot
// (nor the repository's own harness, testkit, outside their tests).
func TestExamplesImportNoInternalPackage(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}: {{join .Imports " "}}`, "../examples/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.Contains(line, "/internal/") || strings.Contains(line, "/testkit/") {
			t.Errorf("an example imports an internal package or the repository's harness: %s", line)
		}
	}
}

// A key=value connection string works like a URL.
func TestOpenWithKeyValueConnString(t *testing.T) {
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	dsn := fmt.Sprintf("host=%s port=%d user=%s dbname=%s", cfg.Host, cfg.Port, cfg.User, cfg.Database)
	db, err := devdb.Open(ctx, devdb.Options{URL: dsn, Schema: "relay_example_kv"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var schema string
	if err := db.Pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil || schema != "relay_example_kv" {
		t.Errorf("current schema %q (%v)", schema, err)
	}
	var jobs int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM relay_jobs`).Scan(&jobs); err != nil {
		t.Errorf("relay_jobs through the schema's search_path: %v", err)
	}
}

// A server that does not answer is an error, not a panic.
func TestOpenFailsCleanly(t *testing.T) {
	ctx := context.Background()
	for _, schema := range []string{"", "relay_example_x"} {
		db, err := devdb.Open(ctx, devdb.Options{URL: "postgres://postgres@127.0.0.1:1/none?connect_timeout=2", Schema: schema})
		if err == nil || db != nil {
			t.Errorf("schema %q: Open against a dead server: %v, %v; want an error", schema, db, err)
		}
	}
}
