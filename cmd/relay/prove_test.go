package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.MainOwnCluster(m) }

// buildRelay compiles this command once for the test.
func buildRelay(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "relay")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runProof runs `relay prove <args>` and returns its summary fields.
func runProof(t *testing.T, bin string, args ...string) map[string]string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"prove"}, args...)...)
	cmd.Env = append(os.Environ(), "DATABASE_URL=")
	out, err := cmd.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	if err != nil {
		t.Fatalf("relay prove %v: %v\n%s", args, err, out)
	}
	if !strings.HasPrefix(last, "proof: ") {
		t.Fatalf("last line is not the summary: %q\n%s", last, out)
	}
	fields := map[string]string{}
	for _, m := range regexp.MustCompile(`(\w+)=(\S+)`).FindAllStringSubmatch(last, -1) {
		fields[m[1]] = m[2]
	}
	return fields
}

// A small version of the proof, with real worker processes, SIGKILLs, a
// SIGTERM and a burst of killed backends, in a fresh schema of the test
// database: the audit must be clean.
func TestProveQueueWithFaults(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	url := testdb.URL(t)
	f := runProof(t, bin, "queue", "--database-url", url, "--jobs", "3000", "--processes", "3", "--concurrency", "4",
		"--job-time", "30ms", "--lease", "1s", "--kill", "3", "--sigterm", "1", "--backend-kill", "2", "--backend-kill-for", "2s", "--pause", "1")
	for k, want := range map[string]string{"jobs": "3000", "succeeded": "3000", "lost": "0", "duplicate_effects": "0",
		"overlapping_executions": "0", "external_overlaps": "0", "kills": "3", "sigterms": "1", "pauses": "1"} {
		if f[k] != want {
			t.Errorf("%s=%s, want %s (%v)", k, f[k], want, f)
		}
	}
	if n, _ := strconv.Atoi(f["backend_kills"]); n == 0 {
		t.Errorf("--backend-kill killed nothing: %v", f)
	}
}

// A worker cut off from PostgreSQL (through the prover's proxy) for longer
// than the lease, while a side connection keeps locking running jobs'
// rows: no two attempts of a job overlap, in the database's view or in the
// outside sink's, and nothing is lost.
func TestProveQueuePartitionAndLockStorm(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	url := testdb.URL(t)
	f := runProof(t, bin, "queue", "--database-url", url, "--jobs", "600", "--processes", "3", "--concurrency", "4",
		"--job-time", "100ms", "--lease", "1s", "--partition", "1", "--lock-storm", "--kill", "1")
	for k, want := range map[string]string{"jobs": "600", "succeeded": "600", "lost": "0", "duplicate_effects": "0",
		"overlapping_executions": "0", "external_overlaps": "0", "partitions": "1", "kills": "1"} {
		if f[k] != want {
			t.Errorf("%s=%s, want %s (%v)", k, f[k], want, f)
		}
	}
	if n, _ := strconv.Atoi(f["locks"]); n == 0 {
		t.Errorf("--lock-storm locked nothing: %v", f)
	}
	if n, _ := strconv.Atoi(f["observed_attempts"]); n < 600 {
		t.Errorf("the sink saw %d attempts of 600 jobs: %v", n, f)
	}
}

// Jobs that run several times longer than the lease are kept alive by
// heartbeats: none runs twice, none overlaps itself.
func TestProveQueueLongJobs(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	url := testdb.URL(t)
	// Jobs 1.75 to 5 leases long (the job time varies ±50%). The lease is
	// not shorter than 2s: heartbeats are bounded by 40% of it, and with
	// 600ms two of them in a row slower than 240ms on a loaded machine lose
	// a lease (a re-execution).
	f := runProof(t, bin, "queue", "--database-url", url, "--jobs", "12", "--processes", "2", "--concurrency", "6",
		"--job-time", "7s", "--lease", "2s")
	if f["succeeded"] != "12" || f["lost"] != "0" || f["duplicate_effects"] != "0" || f["overlapping_executions"] != "0" || f["re_executions"] != "0" {
		t.Fatalf("long jobs: %v", f)
	}
}

// PostgreSQL restarted mid-run, then crashed (immediate shutdown, recovery
// from WAL, which may drop the latest asynchronous claims) in a throwaway
// cluster the command starts itself: workers reconnect, nothing is lost or
// duplicated.
func TestProveQueuePGRestart(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	// A claim commits asynchronously by default, and one not yet flushed is
	// lost in the crash's recovery: its job can be claimed again while the
	// first handler still runs, an overlap at-least-once allows (one CI run
	// saw external_overlaps=1), which the proof reports and does not fail.
	// With synchronous claims overlaps are promised away, and the audit
	// fails on any. Both lose nothing and duplicate no effect.
	for _, sync := range []bool{false, true} {
		t.Run("synchronous claims "+strconv.FormatBool(sync), func(t *testing.T) {
			t.Parallel()
			f := runProof(t, bin, "queue", "--jobs", "600", "--processes", "2", "--concurrency", "4", "--job-time", "10ms",
				"--lease", "1s", "--kill", "1", "--pg-restart", "--pg-crash", "--synchronous-claims="+strconv.FormatBool(sync))
			if f["succeeded"] != "600" || f["lost"] != "0" || f["duplicate_effects"] != "0" {
				t.Fatalf("pg restart: %v", f)
			}
			if sync && (f["overlapping_executions"] != "0" || f["external_overlaps"] != "0") {
				t.Fatalf("pg restart with synchronous claims: overlaps: %v", f)
			}
		})
	}
}

// Three scheduler processes race for one schedule firing every second while
// two of them are SIGKILLed: every fire time has exactly one job.
func TestProveScheduler(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	url := testdb.URL(t)
	f := runProof(t, bin, "scheduler", "--database-url", url, "--processes", "3", "--spec", "@every 1s",
		"--duration", "6s", "--kill", "2")
	if n, _ := strconv.Atoi(f["fires_expected"]); n < 5 || f["enqueued"] != f["fires_expected"] || f["duplicates"] != "0" || f["missed"] != "0" ||
		f["unexpected"] != "0" || f["kills"] != "2" {
		t.Fatalf("prove scheduler: %v", f)
	}
}

// relay bench runs both modes end to end with worker processes and prints
// its summary line last.
func TestBench(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	url := testdb.URL(t)
	for _, args := range [][]string{
		{"--jobs", "2000", "--workers", "20", "--processes", "2"},
		{"--rate", "200", "--duration", "1s", "--workers", "10", "--job-hash", "10"},
		// What the measured jobs run beside (docs/benchmarks.md, cost as
		// the work grows): queues, scheduled and finished rows, jobs due
		// at once, distinct keys; schedules and the wait sampler.
		{"--jobs", "500", "--workers", "20", "--queues", "5", "--fill-scheduled", "100", "--fill-finished", "100", "--due-in", "2s", "--keys", "50", "--cycle-keys"},
		{"--rate", "100", "--duration", "2s", "--workers", "10", "--queues", "3", "--schedules", "3", "--sample-waits", "50ms", "--window", "1s"},
	} {
		out, err := exec.Command(bin, append([]string{"bench", "--database-url", url}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("relay bench %v: %v\n%s", args, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		last := lines[len(lines)-1]
		fields := map[string]string{}
		for _, m := range regexp.MustCompile(`(\w+)=(\S+)`).FindAllStringSubmatch(last, -1) {
			fields[m[1]] = m[2]
		}
		if !strings.HasPrefix(last, "bench: ") {
			t.Fatalf("last line is not the summary: %q", last)
		}
		if w, _ := strconv.ParseFloat(fields["worked_per_s"], 64); w <= 0 {
			t.Errorf("relay bench %v: worked_per_s=%s\n%s", args, fields["worked_per_s"], out)
		}
		if args[0] == "--rate" {
			if p, _ := strconv.ParseFloat(fields["p99_ms"], 64); p <= 0 || fields["jobs"] == "0" {
				t.Errorf("steady run measured no latency: %s", last)
			}
		}
		if slices.Contains(args, "--sample-waits") && !regexp.MustCompile(`(?m)^bench: waits over the run \(0 samples failed\): [1-9]\d* samples`).Match(out) {
			t.Errorf("relay bench %v: no wait-event samples in\n%s", args, out)
		}
		// The bench's order check finds no job whose handler started before
		// its key's previous job's outcome (here its transaction's start:
		// the test cluster does not track commit timestamps), and saw every
		// handler start. Claims' now() before completions' now() may be
		// counted: they are not order violations (docs/ordering-keys.md).
		if slices.Contains(args, "--cycle-keys") && !strings.Contains(string(out),
			"ordering keys 50 (in turn): 0 jobs started before their key's previous job finished, on 0 keys; 0 jobs without a reported start;") {
			t.Errorf("relay bench %v: order check failed or missing in\n%s", args, out)
		}
	}
}

// relay bench's workflow curves, small: a run's long history replayed,
// and sleeping runs woken over a window, each printing its summary line.
func TestBenchCurves(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	url := testdb.URL(t)
	for _, c := range []struct {
		args []string
		want *regexp.Regexp
	}{
		{[]string{"--history", "30"}, regexp.MustCompile(`(?m)^bench: mode=history steps=30 wakes=1 steps_per_s=[1-9]`)},
		// The wake-ups after the first read only the steps the registry
		// does not keep: a mean under 100 steps read per wake-up, where
		// rereading the 100 would be over 100.
		{[]string{"--history", "100", "--wakes", "3"}, regexp.MustCompile(`(?m)^bench: mode=history steps=100 wakes=3 steps_per_s=[1-9].* history_rows_read_per_wake=[0-9]{1,2}$`)},
		{[]string{"--sleepers", "40", "--wake-within", "1s", "--workers", "10"}, regexp.MustCompile(`(?m)^bench: mode=sleepers runs=40 within=1s workers=10 late_p50_ms=`)},
	} {
		out, err := exec.Command(bin, append([]string{"bench", "--database-url", url}, c.args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("relay bench %v: %v\n%s", c.args, err, out)
		}
		if !c.want.Match(out) {
			t.Errorf("relay bench %v: no summary line matching %s in\n%s", c.args, c.want, out)
		}
	}
}

// relay bench --schema keeps its schema and its jobs: a second run in it
// drains its own jobs beside the first run's, which are still there.
func TestBenchSchemaKeepsItsJobs(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	url := testdb.URL(t)
	for range 2 {
		out, err := exec.Command(bin, "bench", "--database-url", url, "--schema", "bench_kept", "--jobs", "50", "--workers", "5").CombinedOutput()
		if err != nil {
			t.Fatalf("relay bench --schema: %v\n%s", err, out)
		}
		if !regexp.MustCompile(`(?m)^bench: mode=burndown system=relay jobs=50 `).Match(out) {
			t.Fatalf("relay bench --schema: no summary line in\n%s", out)
		}
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM bench_kept.relay_jobs WHERE state = 'succeeded'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 100 {
		t.Fatalf("%d jobs succeeded in the kept schema, want both runs' 100", n)
	}
}

// Worker processes are SIGKILLed while jobs call a sink through
// idempotency.External and write through idempotency.Once: one database
// effect and one token per job.
func TestProveIdempotency(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	url := testdb.URL(t)
	f := runProof(t, bin, "idempotency", "--database-url", url, "--jobs", "600", "--processes", "3", "--concurrency", "4",
		"--kill", "3", "--lease", "1s", "--sink-time", "20ms")
	if f["jobs"] != "600" || f["db_effects"] != "600" || f["duplicate_db_effects"] != "0" || f["distinct_tokens"] != "600" || f["kills"] != "3" {
		t.Fatalf("prove idempotency: %v", f)
	}
}

// Events published in business transactions (some rolled back) reach their
// subscriber once each and in order per key, while worker processes (each
// a dispatcher too) are SIGKILLed.
func TestProveOutbox(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	url := testdb.URL(t)
	f := runProof(t, bin, "outbox", "--database-url", url, "--events", "800", "--keys", "10", "--processes", "3",
		"--concurrency", "4", "--kill", "2", "--lease", "1s")
	if f["published"] != f["delivered"] || f["lost"] != "0" || f["duplicates"] != "0" || f["out_of_order"] != "0" || f["kills"] != "2" {
		t.Fatalf("prove outbox: %v", f)
	}
}

// The workflow proof, small: payment runs (charge → email ∥ report as
// children on another queue, the first to end chosen by a Select → sleep
// → one in three takes an address update (HandleUpdate) → a Select of the
// approval signal and a timer → notify, one in ten compensated, each with
// an execution timeout) executed by worker processes that are SIGKILLed and one
// SIGSTOPped past its lease: every run ends as its input asked, each
// database effect once, no run forked, nothing out of order.
func TestProveWorkflow(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	url := testdb.URL(t)
	f := runProof(t, bin, "workflow", "--database-url", url, "--runs", "160", "--processes", "3", "--concurrency", "4",
		"--kill", "2", "--pause", "1", "--lease", "1s", "--sleep", "200ms", "--stall-bound", "40s")
	for k, want := range map[string]string{"runs": "160", "completed": "144", "compensated": "16", "lost": "0", "stalled": "0",
		"duplicate_tx_effects": "0", "forked_runs": "0", "order_violations": "0", "updates": "48", "update_violations": "0",
		"kills": "2", "pauses": "1"} {
		if f[k] != want {
			t.Errorf("%s=%s, want %s (%v)", k, f[k], want, f)
		}
	}
}

// The workflow proof under PostgreSQL faults and operator actions, in a
// throwaway cluster the command starts itself: PostgreSQL restarted and
// crashed, worker backends terminated, a worker cut off from it past its
// lease, run jobs' rows locked by a side connection, a worker SIGKILLed and
// one SIGSTOPped, while one run in ten is cancelled (at each point of its
// path in turn) and one in ten fails while its ledger is down, to be
// retried once the faults are over. Every violation count is 0, and the
// proof itself fails when a fault it was asked for was not exercised (no
// run taken over from the cut-off or stopped worker, no backend
// terminated, no row locked, no cancel accepted, no run retried).
func TestProveWorkflowDatabaseFaults(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	f := runProof(t, bin, "workflow", "--runs", "200", "--processes", "3", "--concurrency", "4", "--lease", "1s", "--sleep", "200ms",
		"--stall-bound", "40s", "--kill", "1", "--pause", "1", "--pg-restart", "--pg-crash", "--backend-kill", "2", "--backend-kill-for", "2s",
		"--partition", "1", "--lock-storm", "--cancel-every", "10", "--retry-failed")
	for k, want := range map[string]string{"runs": "200", "failed": "0", "lost": "0", "stalled": "0", "duplicate_tx_effects": "0",
		"forked_runs": "0", "order_violations": "0", "cancels": "20", "cancel_violations": "0", "retried": "20", "retry_violations": "0",
		"update_violations": "0", "kills": "1", "pauses": "1", "pg_restarts": "1", "pg_crashes": "1", "partitions": "1"} {
		if f[k] != want {
			t.Errorf("%s=%s, want %s (%v)", k, f[k], want, f)
		}
	}
	for _, k := range []string{"cancels_accepted", "cancelled", "backend_kills", "locks", "updates"} {
		if n, _ := strconv.Atoi(f[k]); n == 0 {
			t.Errorf("%s=0: not exercised (%v)", k, f)
		}
	}
	// Every run ends as asked: 20 compensated (report fails), the accepted
	// cancels cancelled, the rest completed (the retried ones included).
	completed, _ := strconv.Atoi(f["completed"])
	compensated, _ := strconv.Atoi(f["compensated"])
	cancelled, _ := strconv.Atoi(f["cancelled"])
	if compensated != 20 || completed+compensated+cancelled != 200 || f["cancelled"] != f["cancels_accepted"] {
		t.Errorf("outcomes: completed=%d compensated=%d cancelled=%d (cancels accepted %s), want 20 compensated and the rest completed or cancelled as accepted",
			completed, compensated, cancelled, f["cancels_accepted"])
	}
}

// relay bench --workflow drains queued runs and times callers' runs, each
// measurement printing its summary line.
func TestBenchWorkflow(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	url := testdb.URL(t)
	out, err := exec.Command(bin, "bench", "--workflow", "--database-url", url, "--runs", "300", "--workers", "20",
		"--callers", "4", "--duration", "1s").CombinedOutput()
	if err != nil {
		t.Fatalf("relay bench --workflow: %v\n%s", err, out)
	}
	var lines []map[string]string
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(l, "bench: mode=workflow-") {
			continue
		}
		fields := map[string]string{}
		for _, m := range regexp.MustCompile(`(\w+)=(\S+)`).FindAllStringSubmatch(l, -1) {
			fields[m[1]] = m[2]
		}
		lines = append(lines, fields)
	}
	if len(lines) != 2 || lines[0]["mode"] != "workflow-queued" || lines[0]["runs"] != "300" || lines[1]["mode"] != "workflow-latency" {
		t.Fatalf("want a queued and a latency line:\n%s", out)
	}
	for _, f := range lines {
		if r, _ := strconv.ParseFloat(f["runs_per_s"], 64); r <= 0 {
			t.Errorf("runs_per_s=%s in %v", f["runs_per_s"], f)
		}
	}
	if p, _ := strconv.ParseFloat(lines[1]["p50_ms"], 64); p <= 0 {
		t.Errorf("latency run measured no p50: %v", lines[1])
	}
}
