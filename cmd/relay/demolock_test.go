package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A second demo on the demo's own cluster, or a demo beside a running
// `relay demo --dashboard`, fails at once naming what is in the way (two
// demos at once used to meet in one cluster directory: "initdb: error:
// failed to remove data directory"), and touches nothing of the first's.
func TestDemoRefusesASecondDemo(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	t.Setenv("DATABASE_URL", "")
	release, err := lockDemoDir()
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(demoDir(), "data", "first-demo")
	if err := os.MkdirAll(filepath.Dir(marker), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{nil, {"--dashboard"}} {
		err := runDemo(context.Background(), args)
		if err == nil || !strings.Contains(err.Error(), "another relay demo is using "+demoDir()) {
			t.Fatalf("relay demo %v beside a running demo: %v, want it refused", args, err)
		}
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the first demo's directory was touched: %v", err)
	}
	release()
	again, err := lockDemoDir()
	if err != nil {
		t.Fatalf("the lock after the first demo ended: %v", err)
	}
	again()
}
