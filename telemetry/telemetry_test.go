package telemetry_test

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/telemetry"
	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type workArgs struct {
	Fail bool `json:"fail"`
}

func (workArgs) Kind() string { return "work" }

// scrape reads one sample of /metrics: the value of the first series named
// name whose labels contain every given label.
func scrape(t *testing.T, srv *httptest.Server, name string, labels ...string) float64 {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, m := range regexp.MustCompile(`(?m)^`+name+`\{([^}]*)\} (\S+)$`).FindAllStringSubmatch(string(body), -1) {
		ok := true
		for _, l := range labels {
			if !regexp.MustCompile(`(^|,)` + regexp.QuoteMeta(l) + `(,|$)`).MatchString(m[1]) {
				ok = false
			}
		}
		if ok {
			v, _ := strconv.ParseFloat(m[2], 64)
			return v
		}
	}
	return 0
}

// The numbers on /metrics move as jobs are enqueued, run, retried and die,
// and the queue gauges read the table.
func TestMetricsEndpoint(t *testing.T) {
	mp, handler, err := telemetry.Prometheus()
	if err != nil {
		t.Fatal(err)
	}
	otel.SetMeterProvider(mp)
	defer otel.SetMeterProvider(noop.NewMeterProvider())
	srv := httptest.NewServer(handler)
	defer srv.Close()
	pool := testdb.New(t)
	ctx := context.Background()

	for _, fail := range []bool{false, false, true} {
		if _, err := core.Enqueue(ctx, pool, workArgs{Fail: fail}, &core.EnqueueOpts{MaxAttempts: 2}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if _, err := core.Enqueue(ctx, pool, workArgs{}, &core.EnqueueOpts{Queue: "idle"}); err != nil {
			t.Fatal(err)
		}
	}
	if v := scrape(t, srv, "relay_jobs_enqueued_total", `queue="default"`, `kind="work"`); v != 3 {
		t.Errorf("enqueued(default) = %v, want 3", v)
	}

	ws := core.NewWorkers()
	core.MustAddWorker(ws, core.WorkFunc[workArgs](func(ctx context.Context, j *core.Job[workArgs]) error {
		if j.Args.Fail {
			return core.RetryIn(0, errors.New("boom"))
		}
		return nil
	}))
	c, err := core.NewClient(pool, &core.Config{Workers: ws, MeterProvider: mp, PollInterval: 20e6})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	testdb.WaitFor(t, "two successes and a dead job", func() bool {
		s := c.Stats()
		return s.Succeeded == 2 && s.Dead == 1
	})
	// Each outcome's metric is added just after its count in Stats: wait
	// for the last ones on the endpoint too, or a scrape in between (a
	// preempted goroutine on a loaded machine) reads one short.
	testdb.WaitFor(t, "their metrics", func() bool {
		return scrape(t, srv, "relay_jobs_succeeded_total", `queue="default"`, `kind="work"`) == 2 &&
			scrape(t, srv, "relay_jobs_dead_total", `queue="default"`, `kind="work"`) == 1
	})
	for name, want := range map[string]float64{
		"relay_jobs_started_total":   4,
		"relay_jobs_succeeded_total": 2,
		"relay_jobs_retried_total":   1,
		"relay_jobs_dead_total":      1,
	} {
		if v := scrape(t, srv, name, `queue="default"`, `kind="work"`); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	if v := scrape(t, srv, "relay_job_duration_seconds_count", `queue="default"`, `kind="work"`); v != 4 {
		t.Errorf("duration count = %v, want 4", v)
	}
	if v := scrape(t, srv, "relay_job_pickup_latency_seconds_count", `queue="default"`); v != 4 {
		t.Errorf("pickup latency count = %v, want 4", v)
	}
	if v := scrape(t, srv, "relay_queue_depth", `queue="idle"`); v != 3 {
		t.Errorf("queue depth(idle) = %v, want 3", v)
	}
	if v := scrape(t, srv, "relay_queue_oldest_age_seconds", `queue="idle"`); v <= 0 {
		t.Errorf("oldest age(idle) = %v, want > 0", v)
	}
}
