package core_test

import (
	"context"
	"testing"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

// Every connection a client opens names itself in pg_stat_activity, after
// the user's own application_name: its bookkeeping pool (worker), its
// heartbeat, its completer and its listener.
func TestConnectionsNameThemselves(t *testing.T) {
	t.Parallel()
	pool := openPool(t, testdb.URL(t)+"&application_name=billing")
	done := make(chan struct{}, 1)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[echoArgs](func(ctx context.Context, j *core.Job[echoArgs]) error {
		done <- struct{}{}
		return nil
	}))
	c := startClient(t, pool, &core.Config{Workers: ws, ID: "names"})
	res, err := core.Enqueue(context.Background(), pool, echoArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-done
	waitState(t, pool, res.ID, core.StateSucceeded)
	for _, role := range []string{"worker", "heartbeat", "completer", "listener"} {
		name := "billing relay-" + role + " " + c.ID()
		waitFor(t, name+" in pg_stat_activity", func() bool {
			return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, name) > 0
		})
	}
}
