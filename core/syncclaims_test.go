package core_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/testkit/devpg"
	"github.com/relayq/relay/testkit/netfault"
)

type syncClaimArgs struct{}

func (syncClaimArgs) Kind() string { return "sync_claim" }

// With a synchronous standby cut off from the primary, a claim made with
// SynchronousClaims waits for the standby (its backend waits on SyncRep)
// and its handler starts only once the standby is back; by default the
// claim commits at once and the handler starts while the standby is cut
// off: that claim would not survive a failover. Both for a plain queue
// and for one under a global limit (whose claim is a transaction of its
// own).
func TestSynchronousClaimsWaitForTheStandby(t *testing.T) {
	if _, err := devpg.BinDir(); err != nil {
		t.Skip(err)
	}
	t.Parallel()
	ctx := context.Background()
	primary, err := devpg.Start(ctx, devpg.Options{Fast: true, SynchronousCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() }) //nolint:errcheck
	link, err := netfault.Listen(fmt.Sprintf("127.0.0.1:%d", primary.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() }) //nolint:errcheck
	standby, err := devpg.StartStandby(ctx, primary, devpg.StandbyOptions{Synchronous: true, Via: link.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() }) //nolint:errcheck
	pool, err := pgxpool.New(ctx, primary.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := migrations.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// The test's own enqueues commit without waiting for the standby.
	local, err := pgxpool.New(ctx, primary.URL+"&options=-c%20synchronous_commit%3Dlocal")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(local.Close)
	if err := core.SetLimit(ctx, pool, core.Limit{Queue: "limited", MaxRunning: 5}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		queue string
		sync  bool
	}{{"plain", false}, {"plain", true}, {"limited", false}, {"limited", true}} {
		name := fmt.Sprintf("%s/synchronous=%v", tc.queue, tc.sync)
		started := make(chan struct{}, 1)
		ws := core.NewWorkers()
		core.MustAddWorker(ws, core.WorkFunc[syncClaimArgs](func(ctx context.Context, j *core.Job[syncClaimArgs]) error {
			started <- struct{}{}
			return nil
		}))
		client, err := core.NewClient(pool, &core.Config{Workers: ws, SynchronousClaims: tc.sync, PollInterval: 50 * time.Millisecond,
			Queues: map[string]core.QueueConfig{tc.queue: {MaxWorkers: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := client.Start(ctx); err != nil {
			t.Fatal(err)
		}
		link.Cut()
		if _, err := core.Enqueue(ctx, local, syncClaimArgs{}, &core.EnqueueOpts{Queue: tc.queue}); err != nil {
			t.Fatal(err)
		}
		if tc.sync {
			// The claim waits for the standby's acknowledgement (under a
			// limit, its transaction's COMMIT does, holding the limits'
			// row locks).
			waitFor(t, name+": a claim waiting on SyncRep", func() bool {
				var n int
				err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity AS a
					WHERE a.wait_event = 'SyncRep' AND (a.query LIKE '%session_commit%'
					   OR EXISTS (SELECT 1 FROM pg_locks AS l WHERE l.pid = a.pid AND l.relation = 'relay_limits'::regclass))`).Scan(&n)
				return err == nil && n > 0
			})
			select {
			case <-started:
				t.Errorf("%s: the handler started before the standby had the claim", name)
			default:
			}
			link.Restore()
			waitStarted(t, name, started)
		} else {
			waitStarted(t, name, started)
			link.Restore()
		}
		stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := client.Stop(stopCtx); err != nil {
			t.Errorf("%s: stop: %v", name, err)
		}
		cancel()
	}
}

func waitStarted(t *testing.T, name string, started <-chan struct{}) {
	t.Helper()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the handler did not start", name)
	}
}
