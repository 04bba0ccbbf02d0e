package migrations_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/testkit/devpg"
	"github.com/relayq/relay/testkit/testdb"
)

var updateSchema = flag.Bool("update", false, "rewrite schema.sql from a freshly migrated database")

// regenerate is the command that rewrites schema.sql; the test prints it
// when the file is stale.
const regenerate = "go test ./migrations -run TestSchemaFile -update"

// schemaHeader opens schema.sql; %d is the major version of the pg_dump
// that printed it.
const schemaHeader = `-- The schema every migration in this directory builds, as PostgreSQL %d's
-- pg_dump --schema-only --no-owner --no-privileges prints it, without its
-- session settings. Generated: do not edit. Regenerate it with
--   ` + regenerate + `
-- A test fails when it is stale. Read it to see the live triggers,
-- functions and indexes; the numbered files remain what runs.

`

// schemaVersion reads the pg_dump major version out of schema.sql's header.
var schemaVersion = regexp.MustCompile(`^-- The schema every migration in this directory builds, as PostgreSQL (\d+)'s`)

// schema.sql is the schema after every migration, as pg_dump prints it: a
// migration added or changed without regenerating it fails here, naming
// the command that regenerates it.
func TestSchemaFile(t *testing.T) {
	t.Parallel()
	pgDump, err := findPgDump()
	if err != nil {
		t.Skipf("no pg_dump to compare schema.sql with: %v", err)
	}
	major, err := pgDumpMajor(pgDump)
	if err != nil {
		t.Fatal(err)
	}
	url := testdb.URL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	var serverMajor int
	err = conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int / 10000").Scan(&serverMajor)
	conn.Close(ctx)
	if err != nil {
		t.Fatalf("read server version: %v", err)
	}
	if serverMajor > major {
		t.Skipf("pg_dump %d cannot dump a PostgreSQL %d server", major, serverMajor)
	}
	got := fmt.Sprintf(schemaHeader, major) + dumpSchema(t, pgDump, url)

	if *updateSchema {
		if err := os.WriteFile("schema.sql", []byte(got), 0o644); err != nil {
			t.Fatalf("write schema.sql: %v", err)
		}
		return
	}
	want, err := os.ReadFile("schema.sql")
	if err != nil {
		t.Fatalf("read schema.sql: %v (create it with: %s)", err, regenerate)
	}
	if m := schemaVersion.FindSubmatch(want); m != nil && string(m[1]) != fmt.Sprint(major) {
		// pg_dump's layout changes between major versions: a file printed
		// by another version differs in form, not in schema.
		t.Skipf("schema.sql was printed by PostgreSQL %s's pg_dump, this machine has %d's", m[1], major)
	}
	if string(want) != got {
		t.Fatalf("migrations/schema.sql is stale (the migrations build another schema): regenerate it with\n\t%s\nfirst difference:\n%s",
			regenerate, firstDifference(string(want), got))
	}
}

// schema.sql builds the schema the migrations build: loaded into an empty
// database, it dumps as a migrated database does (a function body that
// lost a line to the dump's normalization would not even load). It loads
// with the one session setting of pg_dump's it needs: function bodies are
// not checked at CREATE, as the dump creates functions before the tables
// they read.
func TestSchemaFileBuildsTheSchema(t *testing.T) {
	t.Parallel()
	pgDump, err := findPgDump()
	if err != nil {
		t.Skipf("no pg_dump to compare schema.sql with: %v", err)
	}
	file, err := os.ReadFile("schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	empty := testdb.EmptyURL(t)
	conn, err := pgx.Connect(ctx, empty)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	_, err = conn.PgConn().Exec(ctx, "SET check_function_bodies = false;\n"+string(file)).ReadAll()
	conn.Close(ctx)
	if err != nil {
		t.Fatalf("load schema.sql into an empty database: %v", err)
	}
	migrated, loaded := dumpSchema(t, pgDump, testdb.URL(t)), dumpSchema(t, pgDump, empty)
	if loaded != migrated {
		t.Fatalf("schema.sql builds another schema than the migrations; first difference:\n%s", firstDifference(loaded, migrated))
	}
}

// dumpSchema is the normalized schema-only dump of the database at url.
func dumpSchema(t *testing.T, pgDump, url string) string {
	t.Helper()
	out, err := exec.Command(pgDump, "--schema-only", "--no-owner", "--no-privileges", "--dbname", url).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("pg_dump: %v: %s", err, stderr)
	}
	return normalizeDump(string(out))
}

// findPgDump looks for pg_dump on PATH, then beside the server binaries the
// tests' throwaway clusters use.
func findPgDump() (string, error) {
	if p, err := exec.LookPath("pg_dump"); err == nil {
		return p, nil
	}
	dir, err := devpg.BinDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "pg_dump")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("find pg_dump: %w", err)
	}
	return p, nil
}

// pgDumpMajor is the major version pg_dump --version reports.
func pgDumpMajor(pgDump string) (int, error) {
	out, err := exec.Command(pgDump, "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("pg_dump --version: %w", err)
	}
	m := regexp.MustCompile(`\) (\d+)`).FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pg_dump --version: no version in %q", out)
	}
	var v int
	fmt.Sscan(string(m[1]), &v)
	return v, nil
}

// normalizeDump drops what changes from one dump to the next without the
// schema changing: the banner and version lines, the session settings, the
// \restrict guard with its random key (newer pg_dump releases), the
// frames and owner column of the comment naming each object (the dump is
// taken without owners), and runs of blank lines. Nothing inside a
// function's dollar-quoted body is dropped: a body's own line may begin
// with "SET " (an UPDATE's SET clause) and is not a session setting.
func normalizeDump(dump string) string {
	var b strings.Builder
	blank := true // drop blank lines at the start
	body := ""    // the dollar-quote tag of the body the line is in, "" outside one
	for _, line := range strings.Split(dump, "\n") {
		inBody := body != ""
		body = dollarQuote(body, line)
		if inBody {
			b.WriteString(line)
			b.WriteString("\n")
			blank = false
			continue
		}
		switch {
		case strings.HasPrefix(line, "SET "),
			strings.HasPrefix(line, "SELECT pg_catalog.set_config('search_path'"),
			strings.HasPrefix(line, `\restrict`), strings.HasPrefix(line, `\unrestrict`),
			strings.HasPrefix(line, "-- Dumped from database version"),
			strings.HasPrefix(line, "-- Dumped by pg_dump version"),
			line == "-- PostgreSQL database dump",
			line == "-- PostgreSQL database dump complete":
			continue
		}
		if line == "--" { // the frame around each object's name line
			continue
		}
		line = strings.TrimSuffix(line, "; Owner: -")
		if strings.TrimSpace(line) == "" {
			if !blank {
				b.WriteString("\n")
			}
			blank = true
			continue
		}
		blank = false
		b.WriteString(line)
		b.WriteString("\n")
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

// dollarTag is a dollar-quote delimiter: $$ or $tag$ (a tag does not begin
// with a digit, so $1 is not one).
var dollarTag = regexp.MustCompile(`\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$`)

// dollarQuote returns the dollar-quote tag open after line, given the tag
// open before it ("" for none): outside a body the first tag opens one,
// and inside only the same tag closes it.
func dollarQuote(open, line string) string {
	for _, tag := range dollarTag.FindAllString(line, -1) {
		switch {
		case open == "":
			open = tag
		case tag == open:
			open = ""
		}
	}
	return open
}

// firstDifference shows the first line where want and got part, with a
// little context.
func firstDifference(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			var b bytes.Buffer
			fmt.Fprintf(&b, "line %d:\n", i+1)
			fmt.Fprintf(&b, "  schema.sql:  %q\n", wl)
			fmt.Fprintf(&b, "  migrations:  %q\n", gl)
			return b.String()
		}
	}
	return "(none)"
}
