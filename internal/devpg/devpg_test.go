package devpg

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
)

// A cluster whose starting process died without stopping it (go test's
// timeout, a panic, a SIGKILL) is stopped and removed by the next Start; a
// cluster whose owner lives is left alone.
func TestStartReapsOrphanedClusters(t *testing.T) {
	if _, err := BinDir(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	orphan, err := Start(ctx, Options{Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := os.Stat(orphan.Dir); err == nil {
			orphan.Stop() //nolint:errcheck
		}
	})
	postmaster, err := readPID(filepath.Join(orphan.Dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(orphan.Dir, ownerFile), []byte(strconv.Itoa(gone.ProcessState.Pid())), 0o644); err != nil {
		t.Fatal(err)
	}

	kept, err := Start(ctx, Options{Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Stop() //nolint:errcheck
	if _, err := os.Stat(orphan.Dir); !os.IsNotExist(err) {
		t.Errorf("the orphaned cluster's directory is still there (stat: %v)", err)
	}
	if alive(postmaster) {
		t.Errorf("the orphaned cluster's server (PID %d) still runs", postmaster)
	}

	reapOrphans(nil)
	conn, err := pgx.Connect(ctx, kept.URL)
	if err != nil {
		t.Fatalf("a cluster whose owner lives was reaped: %v", err)
	}
	conn.Close(ctx)
}
