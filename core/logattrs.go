package core

import (
	"bytes"
	"encoding/json"
)

// The workflow layer stores the run a job executes in the job's metadata,
// under "relay.run_id". The core names that run in its log lines about the
// job, so that on-call finds the run (not only the job) in the logs; it
// reads the key from the metadata it already holds (the rescue's statement
// returns it), adding no query.

// withRunID returns the log attributes attrs, with run_id first when
// runID is not "".
func withRunID(runID string, attrs ...any) []any {
	if runID == "" {
		return attrs
	}
	return append([]any{"run_id", runID}, attrs...)
}

// jobLogAttrs is the attributes naming job r in a log line (its id, kind
// and, for a workflow run's job, the run's id), followed by attrs.
func jobLogAttrs(r *JobRow, attrs ...any) []any {
	return withRunID(runIDOf(r.Metadata), append([]any{"job_id", r.ID, "kind", r.Kind}, attrs...)...)
}

// runIDOf is the workflow run named by a job's encoded metadata
// ("relay.run_id"), "" for
// none (or metadata that does not decode: a log line is no place to fail).
func runIDOf(meta json.RawMessage) string {
	if !bytes.Contains(meta, []byte(`"relay.run_id"`)) {
		return "" // most jobs: no decoding
	}
	var m struct {
		RunID string `json:"relay.run_id"`
	}
	json.Unmarshal(meta, &m) //nolint:errcheck // best effort, see above
	return m.RunID
}
