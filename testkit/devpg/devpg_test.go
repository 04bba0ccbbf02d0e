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

// A synchronous standby has every commit the primary acknowledged; after
// the primary is killed and the standby promoted, a multi-host URL with
// target_session_attrs=read-write reaches the new primary, and the
// acknowledged rows are there.
func TestStandbyFailover(t *testing.T) {
	if _, err := BinDir(); err != nil {
		t.Skip(err)
	}
	for _, sync := range []bool{true, false} {
		t.Run(map[bool]string{true: "sync", false: "async"}[sync], func(t *testing.T) {
			ctx := context.Background()
			primary, err := Start(ctx, Options{Fast: true, SynchronousCommit: true})
			if err != nil {
				t.Fatal(err)
			}
			defer primary.Stop() //nolint:errcheck
			standby, err := StartStandby(ctx, primary, StandbyOptions{Synchronous: sync})
			if err != nil {
				t.Fatal(err)
			}
			defer standby.Stop() //nolint:errcheck
			url := MultiHostURL(primary, standby)
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `CREATE TABLE acked (n int); INSERT INTO acked SELECT generate_series(1, 100)`); err != nil {
				t.Fatal(err)
			}
			var syncNames string
			if err := conn.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&syncNames); err != nil {
				t.Fatal(err)
			}
			if sync != (syncNames == `"`+standby.Name()+`"`) {
				t.Errorf("synchronous_standby_names = %q on the primary", syncNames)
			}
			conn.Close(ctx)
			// Read-only on the standby.
			sconn, err := pgx.Connect(ctx, standby.URL)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sconn.Exec(ctx, `INSERT INTO acked VALUES (0)`); err == nil {
				t.Error("the standby accepted a write")
			}
			sconn.Close(ctx)

			if err := primary.Kill(ctx); err != nil {
				t.Fatal(err)
			}
			if err := standby.Promote(ctx); err != nil {
				t.Fatal(err)
			}
			conn, err = pgx.Connect(ctx, url)
			if err != nil {
				t.Fatalf("the multi-host URL after the failover: %v", err)
			}
			defer conn.Close(ctx)
			if conn.PgConn().Conn().RemoteAddr().String() != "127.0.0.1:"+strconv.Itoa(standby.Port) {
				t.Errorf("connected to %s, want the promoted standby", conn.PgConn().Conn().RemoteAddr())
			}
			var n int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM acked`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			// Async: the rows were committed well before the kill and the
			// standby waited for; only sync guarantees it, but both see them.
			if n != 100 {
				t.Errorf("%d of 100 acknowledged rows on the promoted standby", n)
			}
			if _, err := conn.Exec(ctx, `INSERT INTO acked VALUES (101)`); err != nil {
				t.Errorf("the promoted standby refuses writes: %v", err)
			}
		})
	}
}

// A cluster in Options.Dir keeps its data across Shutdown and a new Start
// (on a new port), and Discard stops and removes it.
func TestDirKeepsTheClusterAcrossStarts(t *testing.T) {
	if _, err := BinDir(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	// Under os.TempDir, not t.TempDir: as root the server runs as another
	// user, who must reach the directory.
	dir := filepath.Join(os.TempDir(), "relay-devpg-test-kept-"+strconv.Itoa(os.Getpid()))
	t.Cleanup(func() { Discard(dir) }) //nolint:errcheck
	c, err := Start(ctx, Options{Fast: true, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	exec1 := func(url, sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec1(c.URL, `CREATE TABLE kept (n int); INSERT INTO kept VALUES (42)`)
	if err := c.Shutdown(); err != nil {
		t.Fatal(err)
	}
	again, err := Start(ctx, Options{Fast: true, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	exec1(again.URL, `DO $$ BEGIN IF (SELECT n FROM kept) <> 42 THEN RAISE 'lost'; END IF; END $$`)
	if err := Discard(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("Discard left %s: %v", dir, err)
	}
	if conn, err := pgx.Connect(ctx, again.URL); err == nil {
		conn.Close(ctx)
		t.Errorf("the discarded cluster still answers")
	}
}
