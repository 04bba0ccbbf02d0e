package admin

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/outbox"
	"github.com/relayq/relay/scheduler"
	"github.com/relayq/relay/testkit/testdb"
)

// The scheduler's fires and the outbox dispatcher's batches run in
// sessions named for them (after the pool's own application_name) while
// their transaction lasts: a trigger records the name each job was
// inserted under.
func TestSchedulerAndDispatcherNameTheirSessions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.URL(t)+"&application_name=billing")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `
		CREATE TABLE inserted_by (kind text, app text);
		CREATE FUNCTION record_app() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO inserted_by VALUES (NEW.kind, current_setting('application_name'));
			RETURN NEW;
		END $$;
		CREATE TRIGGER record_app AFTER INSERT ON relay_jobs FOR EACH ROW EXECUTE FUNCTION record_app();`); err != nil {
		t.Fatal(err)
	}
	sched, err := scheduler.New(pool, &scheduler.Config{Schedules: []scheduler.Schedule{{Name: "named-every-second", Spec: "@every 1s", Args: roleJob{Via: "scheduler"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sched.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer stopBounded(t, sched.Stop)
	disp, err := outbox.NewDispatcher(pool, &outbox.Config{Subscriptions: []outbox.Subscription{{Topic: "named.topic", Kind: "role-event"}}, PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := disp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer stopBounded(t, disp.Stop)
	if _, err := outbox.Publish(ctx, pool, outbox.Event{Topic: "named.topic", Payload: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.Enqueue(ctx, pool, roleJob{Via: "caller"}, nil); err != nil {
		t.Fatal(err)
	}
	for kind, want := range map[string]string{"role-job": "billing relay-scheduler", "role-event": "billing relay-dispatcher"} {
		testdb.WaitFor(t, kind+" inserted by "+want, func() bool {
			return testdb.Count(t, pool, `SELECT count(*) FROM inserted_by WHERE kind = $1 AND app = $2`, kind, want) > 0
		})
	}
	// The name lasts only the transaction: the caller's own enqueue, on
	// the same pool, keeps the pool's name.
	if n := testdb.Count(t, pool, `SELECT count(*) FROM inserted_by WHERE app = 'billing'`); n != 1 {
		t.Errorf("%d jobs inserted under the pool's own name, want the caller's one", n)
	}
}
