package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// jaegerConfig is the configuration the docs give for Jaeger on other
// ports (in memory, on 127.0.0.1 only), with its ports replaced by free
// ones: the file users copy is the one this test runs.
func jaegerConfig(t *testing.T, queryHTTP, queryGRPC, otlpGRPC, otlpHTTP int) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "tools", "jaeger", "other-ports.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(b)
	for from, to := range map[string]int{"127.0.0.1:26686": queryHTTP, "127.0.0.1:26685": queryGRPC, "127.0.0.1:24317": otlpGRPC, "127.0.0.1:24318": otlpHTTP} {
		if !strings.Contains(cfg, from) {
			t.Fatalf("tools/jaeger/other-ports.yaml no longer names %s", from)
		}
		cfg = strings.ReplaceAll(cfg, from, fmt.Sprintf("127.0.0.1:%d", to))
	}
	return cfg
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// otlpSpan is the part of an OTLP/JSON span the test reads.
type otlpSpan struct {
	Name         string          `json:"name"`
	Kind         json.RawMessage `json:"kind"`
	SpanID       string          `json:"spanId"`
	ParentSpanID string          `json:"parentSpanId"`
	Status       struct {
		Code json.RawMessage `json:"code"`
	} `json:"status"`
}

// startJaeger runs Jaeger and points OTLP export at it; it returns the
// query API's base URL and Jaeger's logs.
func startJaeger(t *testing.T) (string, *bytes.Buffer) {
	bin := os.Getenv("RELAY_JAEGER_BIN")
	if bin == "" {
		const why = "RELAY_JAEGER_BIN not set (tools/jaeger/build.sh builds Jaeger; .ci/run sets it)"
		if os.Getenv("CI") == "true" {
			t.Fatal(why + ": under CI=true this test must run")
		}
		t.Skip(why)
	}
	queryHTTP, queryGRPC, otlpGRPC, otlpHTTP := freePort(t), freePort(t), freePort(t), freePort(t)
	cfg := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfg, []byte(jaegerConfig(t, queryHTTP, queryGRPC, otlpGRPC, otlpHTTP)), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &bytes.Buffer{}
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	api := fmt.Sprintf("http://127.0.0.1:%d", queryHTTP)
	testdb.WaitFor(t, "Jaeger's query API", func() bool {
		resp, err := http.Get(api + "/api/services")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", fmt.Sprintf("http://127.0.0.1:%d", otlpHTTP))
	return api, logs
}

// traceSpans reads a trace's spans from Jaeger's query API, waiting until
// complete says they are all there.
func traceSpans(t *testing.T, api, traceID string, complete func([]otlpSpan) bool) []otlpSpan {
	var spans []otlpSpan
	testdb.WaitFor(t, "the trace in Jaeger", func() bool {
		resp, err := http.Get(api + "/api/v3/traces/" + traceID)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body struct {
			Result struct {
				ResourceSpans []struct {
					ScopeSpans []struct {
						Spans []otlpSpan `json:"spans"`
					} `json:"scopeSpans"`
				} `json:"resourceSpans"`
			} `json:"result"`
		}
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&body) != nil {
			return false
		}
		spans = spans[:0]
		for _, rs := range body.Result.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				spans = append(spans, ss.Spans...)
			}
		}
		return complete(spans)
	})
	return spans
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func isError(s otlpSpan) bool {
	code := strings.Trim(string(s.Status.Code), `"`)
	return code == "STATUS_CODE_ERROR" || code == "2"
}

// The workflow charge → (email ∥ report as children) → notify, whose email
// step fails twice, is one trace in Jaeger: the run's root, its executions,
// its children's roots and executions, and every step attempt, the two
// failed ones marked as errors.
func TestWorkflowTraceInJaeger(t *testing.T) {
	api, logs := startJaeger(t)
	var out bytes.Buffer
	traceID, err := runWorkflow(context.Background(), testdb.URL(t), &out)
	if err != nil || traceID == "" {
		t.Fatalf("run: %q %v\n%s", traceID, err, out.String())
	}
	spans := traceSpans(t, api, traceID, func(spans []otlpSpan) bool {
		sends, notified := 0, false
		for _, s := range spans {
			sends += btoi(s.Name == "workflow.step send")
			notified = notified || s.Name == "workflow.step notify"
		}
		return sends >= 3 && notified
	})
	count := map[string]int{}
	failed := 0
	for _, s := range spans {
		count[s.Name]++
		if s.Name == "workflow.step send" && isError(s) {
			failed++
		}
	}
	for name, want := range map[string]int{"workflow payment": 1, "workflow email": 1, "workflow report": 1,
		"workflow.step charge": 1, "workflow.step send": 3, "workflow.step write": 1, "workflow.step notify": 1,
		"workflow.child email": 1, "workflow.child report": 1} {
		if count[name] != want {
			t.Errorf("trace %s: %d spans %q, want %d", traceID, count[name], name, want)
		}
	}
	if count["workflow.execute payment"] < 2 || failed != 2 {
		t.Errorf("trace %s: %d executions of the parent (want ≥ 2), %d failed send attempts (want 2)", traceID, count["workflow.execute payment"], failed)
	}
	if t.Failed() {
		t.Logf("spans: %v\njaeger: %s", count, logs.String())
	}
}

// The example's job, exported over OTLP to a real Jaeger and read back from
// its query API: one trace holding the enqueue and three attempts, the
// first two with error status. Needs the Jaeger binary: .ci/run builds it
// (tools/jaeger/build.sh) and sets RELAY_JAEGER_BIN.
func TestTraceInJaeger(t *testing.T) {
	api, logs := startJaeger(t)
	var out bytes.Buffer
	res, err := run(context.Background(), testdb.URL(t), &out)
	if err != nil || res.TraceID == "" || res.ExportErr != nil {
		t.Fatalf("run: %+v %v\n%s", res, err, out.String())
	}
	traceID := res.TraceID
	spans := traceSpans(t, api, traceID, func(spans []otlpSpan) bool {
		return len(spans) >= 7 // producer, 3 attempts, 3 handler spans
	})
	var producers, attempts, failed int
	for _, s := range spans {
		switch s.Name {
		case "send default":
			producers++
		case "process default":
			attempts++
			if code := strings.Trim(string(s.Status.Code), `"`); code == "STATUS_CODE_ERROR" || code == "2" {
				failed++
			}
		}
	}
	if producers != 1 || attempts != 3 || failed != 2 {
		t.Fatalf("trace %s: %d producer spans, %d attempts (%d failed); want 1, 3 (2)\nspans: %+v\njaeger: %s", traceID, producers, attempts, failed, spans, logs.String())
	}
}

// With no collector listening the example still runs the job, returns the
// trace id, and reports the failed export (it does not fail): main prints
// both. A plain host:port endpoint means plain HTTP.
func TestNoCollector(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", fmt.Sprintf("127.0.0.1:%d", freePort(t))) // nothing listens there
	var out bytes.Buffer
	res, err := run(context.Background(), testdb.URL(t), &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if len(res.TraceID) != 32 || res.ExportErr == nil || !strings.HasPrefix(res.Endpoint, "http://127.0.0.1:") {
		t.Fatalf("result %+v; want a trace id, an export error, a plain http endpoint", res)
	}
	if !strings.Contains(out.String(), "attempt 3: charged order 42") {
		t.Errorf("the job did not run:\n%s", out.String())
	}
}

// The docs' Jaeger configuration for other ports names every port it
// claims to, so that TestTraceInJaeger (which needs Jaeger) can run it.
func TestJaegerConfigForOtherPorts(t *testing.T) {
	cfg := jaegerConfig(t, 1, 2, 3, 4)
	for _, want := range []string{"127.0.0.1:1 ", "127.0.0.1:2 ", "127.0.0.1:3 ", "127.0.0.1:4 ", "traces: mem"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("the configuration lacks %q:\n%s", want, cfg)
		}
	}
}
