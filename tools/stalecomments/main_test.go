package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeTree writes files (path → text) under a fresh directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, text := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Comments naming identifiers, package members and files that exist pass;
// each one naming what does not exist is reported once, at its line.
func TestCheckReportsNamesThatDoNotExist(t *testing.T) {
	t.Parallel()
	dir := writeTree(t, map[string]string{
		"core/lease.go": `package core

// HoldLease keeps the lease; see lease_test.go and docs/x.md.
func HoldLease() {}

type Client struct{ leaseBudget int }

// Execute runs it.
func (c *Client) Execute() {}
`,
		"docs/x.md": "x",
		"core/lease_test.go": `package core

import "testing"

func TestLease(t *testing.T) {}
`,
		"workflow/run.go": `package workflow

// run calls core.HoldLease and core.Client.Execute, keeps leaseBudget,
// and is tested by Lease (go test -run Lease).
//
// Stale: core.LeaseCheck, sqlRunExists, and see fence in execution.go.
// Examples in doc comments declare their own names:
//
//	chargeCard(ctx)
//
// Not files: the .tx.up.sql suffix; not names: PostgreSQL at https://x.org/fooBar.go
func run() {}
`,
	})
	got, err := check(dir, map[string]bool{"PostgreSQL": true})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"workflow/run.go:6: core.LeaseCheck: package core declares no LeaseCheck",
		"workflow/run.go:6: execution.go: no such file in the repository",
		"workflow/run.go:6: sqlRunExists: no such identifier in the repository's Go code",
	}
	for i := range got {
		got[i] = strings.TrimPrefix(got[i], dir+string(filepath.Separator))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("findings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
