package admin

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/scheduler"
)

// GET /v1/processes lists each started client with its host, pid, version,
// role and queues with their slots, and a scheduler with what it declares;
// the filters narrow by role and by queue served; a stopped client is gone.
// GET /v1/queues counts the live workers and slots serving each queue.
func TestProcessesThroughAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[countArgs](func(_ context.Context, _ *core.Job[countArgs]) error { return nil }))
	startClient(t, b.pool, &core.Config{Workers: ws, ID: "mailer",
		Queues: map[string]core.QueueConfig{"mail": {MaxWorkers: 4}, "default": {MaxWorkers: 1}}})
	other := startClient(t, b.pool, &core.Config{Workers: ws, ID: "reporter",
		Queues: map[string]core.QueueConfig{"reports": {MaxWorkers: 2}}})
	s, err := scheduler.New(b.pool, &scheduler.Config{Namespace: "billing",
		Schedules: []scheduler.Schedule{{Name: "invoice", Spec: "@every 1h", Args: countArgs{}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(b.ctx) })

	items := func(path string) []map[string]any {
		t.Helper()
		var out []map[string]any
		for _, i := range b.ok(b.do("GET", path, b.ro, nil))["items"].([]any) {
			out = append(out, i.(map[string]any))
		}
		return out
	}
	all := items("/v1/processes")
	if len(all) != 3 {
		t.Fatalf("%d processes; want the two clients and the scheduler: %v", len(all), all)
	}
	host, _ := os.Hostname()
	byName := map[string]map[string]any{}
	for _, p := range all {
		if p["host"] != host || int(p["pid"].(float64)) != os.Getpid() || p["version"] == "" || p["last_seen_at"] == nil || p["expires_at"] == nil {
			t.Errorf("process %v: want this host, pid and a version, last seen and expiry", p)
		}
		name, _ := p["name"].(string) // absent for a scheduler
		byName[p["role"].(string)+"/"+name] = p
	}
	mailer := byName["worker/mailer"]
	if q := mailer["queues"].([]any); len(q) != 2 || q[0].(map[string]any)["name"] != "default" || q[1].(map[string]any)["slots"].(float64) != 4 {
		t.Errorf("mailer's queues %v; want default (1) and mail (4), by name", q)
	}
	sched := byName["scheduler/"]
	if sched["namespace"] != "billing" || len(sched["declares"].([]any)) != 1 || sched["declares"].([]any)[0] != "invoice" {
		t.Errorf("scheduler entry %v; want namespace billing declaring invoice", sched)
	}
	if got := items("/v1/processes?queue=mail"); len(got) != 1 || got[0]["name"] != "mailer" {
		t.Errorf("?queue=mail: %v; want the mailer", got)
	}
	if got := items("/v1/processes?role=scheduler"); len(got) != 1 || got[0]["namespace"] != "billing" {
		t.Errorf("?role=scheduler: %v", got)
	}
	b.problem(b.do("GET", "/v1/processes?role=robot", b.ro, nil), 422)

	// A queue with runnable jobs reports who serves it.
	for _, q := range []string{"mail", "reports"} {
		if _, err := core.Enqueue(b.ctx, b.pool, countArgs{}, &core.EnqueueOpts{Queue: q, Delay: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
	if got := items("/v1/processes?role=worker"); len(got) != 1 || got[0]["name"] != "mailer" {
		t.Errorf("after the reporter stopped: %v; want the mailer alone", got)
	}
	if q := b.ok(b.do("GET", "/v1/queues/default", b.ro, nil)); q["processes"].(float64) != 1 || q["slots"].(float64) != 1 {
		t.Errorf("idle queue default: %v processes, %v slots; want the mailer's 1", q["processes"], q["slots"])
	}
	for _, q := range items("/v1/queues") {
		want := map[string][2]float64{"mail": {1, 4}, "reports": {0, 0}}[q["name"].(string)]
		if q["processes"].(float64) != want[0] || q["slots"].(float64) != want[1] {
			t.Errorf("queue %s: %v processes, %v slots; want %v", q["name"], q["processes"], q["slots"], want)
		}
	}
}
