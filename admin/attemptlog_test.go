package admin

import (
	"strings"
	"testing"
)

// TestAttemptWithoutTimesIsLeftOut: a stored attempt-log entry without its
// times (an older version's, or one written behind the API) is not listed
// with 0001-01-01 times, which stretched the run page's time axis over
// two thousand years: it is left out, and attempt_log_error says so.
func TestAttemptWithoutTimesIsLeftOut(t *testing.T) {
	t.Parallel()
	b := setupWorkflows(t)
	start(b, b.greet, "greet-zero", "ada")
	b.waitRun("greet-zero", "completed")
	b.exec(`UPDATE relay_workflow_steps SET attempt_log = '[{"attempt": 1}, {"attempt": 2, "started_at": "2026-12-01T10:00:00Z", "finished_at": "2026-12-01T10:00:01Z"}]'
		WHERE run_id = 'greet-zero' AND key = 'hello'`)
	run := b.ok(b.do("GET", "/v1/workflows/runs/greet-zero", b.ro, nil))
	if body := string(mustJSON(run)); strings.Contains(body, "0001-01-01") {
		t.Fatalf("a zero time in the run: %s", body)
	}
	st := steps(run)["hello"]
	log := st["attempt_log"].([]any)
	if len(log) != 1 || log[0].(map[string]any)["attempt"].(float64) != 2 {
		t.Fatalf("attempt log %v, want attempt 2 alone", log)
	}
	if e, _ := st["attempt_log_error"].(string); !strings.Contains(e, "attempt 1") {
		t.Fatalf("attempt_log_error %q", e)
	}
}
