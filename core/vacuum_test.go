package core_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

func TestAutovacuumSettings(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var opts string
	if err := pool.QueryRow(context.Background(),
		`SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = 'relay_jobs'::regclass`).Scan(&opts); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"autovacuum_vacuum_scale_factor=0.01", "autovacuum_vacuum_threshold=1000"} {
		if !strings.Contains(opts, want) {
			t.Errorf("relay_jobs reloptions %q lack %q", opts, want)
		}
	}
}

func TestWarnsWhenAutovacuumIsOff(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	if _, err := pool.Exec(context.Background(), `ALTER TABLE relay_jobs SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	startClient(t, pool, &core.Config{
		Workers: core.NewWorkers(),
		Logger:  slog.New(slog.NewTextHandler(&logs, nil)),
	})
	// The server itself may have autovacuum off too (the shared development
	// server does); either warning names what to do.
	testdb.WaitFor(t, "the autovacuum warning", func() bool {
		s := logs.String()
		return strings.Contains(s, "level=WARN") && strings.Contains(s, "autovacuum") && strings.Contains(s, "VACUUM")
	})
	if n := strings.Count(logs.String(), "autovacuum is"); n != 1 {
		t.Fatalf("the warning was logged %d times, want once:\n%s", n, logs.String())
	}
}
