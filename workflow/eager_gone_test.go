package workflow_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/workflow"
)

// slowInsert makes the eager statement of run id 'slow-<name>' (or of
// every run of workflow wf) sleep secs seconds in a trigger.
func slowInsert(t *testing.T, b *bundle, cond string, secs int) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), `
		CREATE FUNCTION test_slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(`+strconv.Itoa(secs)+`); RETURN NEW; END $$;
		CREATE TRIGGER test_slow_insert BEFORE INSERT ON relay_workflow_runs
		    FOR EACH ROW WHEN (`+cond+`) EXECUTE FUNCTION test_slow_insert();`); err != nil {
		t.Fatal(err)
	}
}

// A RunNow whose ctx ends during its insert, then the client's Stop with a
// deadline shorter than the insert: the job the statement commits claimed
// for the stopping client is not left claimed by nobody until its lease
// expires (a hostile review found it so when the statement's answer was
// settled in the background after RunNow returned).
func TestEagerStopDuringAnInsertWhoseCallerLeft(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slowInsert(t, b, "NEW.id = 'slow'", 3)
	wf := workflow.MustRegister(b.reg, "eager.stop", func(wctx workflow.Context, in int) (int, error) { return in, nil })
	ws := core.NewWorkers()
	if err := b.reg.AddWorkers(ws); err != nil {
		t.Fatal(err)
	}
	c, err := core.NewClient(b.pool, &core.Config{Workers: ws, LeaseDuration: time.Minute, PollInterval: 50 * time.Millisecond,
		Queues: map[string]core.QueueConfig{core.DefaultQueue: {MaxWorkers: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(callerCtx(t))
	done := make(chan error, 1)
	go func() { _, err := workflow.RunNow(ctx, c, wf, 1, &workflow.StartOpts{ID: "slow"}); done <- err }()
	b.waitFor("the insert sleeping", func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'`) == 1
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("RunNow: %v", err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), time.Second)
	defer scancel()
	stopErr := c.Stop(sctx)
	b.waitFor("the statement committed", func() bool {
		return b.count(`SELECT count(*) FROM relay_workflow_runs WHERE id = 'slow'`) == 1
	})
	claimed := b.count(`SELECT count(*) FROM relay_jobs j JOIN relay_workflow_runs r ON r.job_id = j.id
		WHERE r.id = 'slow' AND j.state = 'claimed' AND j.lease_expires_at > now()`)
	if stopErr == nil && claimed == 1 {
		t.Fatalf("Stop returned nil, yet the job committed after it is left claimed by the stopped client (lease 1 min, attempt counted)")
	}
}
