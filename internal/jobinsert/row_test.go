package jobinsert

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// AppendBatch writes what encoding/json would for the same rows.
func TestAppendBatchMatchesEncodingJSON(t *testing.T) {
	at := time.Date(2026, 11, 29, 10, 11, 12, 131415000, time.FixedZone("X", 3600))
	key := "order \"7\"\\ é ✓ \x01\n"
	rows := []Row{
		{Kind: "plain", Queue: "default", Args: json.RawMessage(`{"a":1,"b":"x\"y"}`), Priority: 0, MaxAttempts: 25, Metadata: json.RawMessage(`{}`)},
		{Kind: "k\"ind\\\t", Queue: "q\u2028ü", Args: json.RawMessage(`{}`), Priority: 32767, MaxAttempts: 1, RunAt: &at, DelayUS: 0,
			Metadata: json.RawMessage(`{"trace":"abc"}`), UniqueKey: &key, UniqueStates: []string{"queued", "claimed"}},
		{Kind: "delayed", Queue: "d", Args: json.RawMessage(`{"n":[1,2,3]}`), MaxAttempts: 3, DelayUS: 1500000, Metadata: json.RawMessage(`{}`)},
	}
	want, err := json.Marshal(rows)
	if err != nil {
		t.Fatal(err)
	}
	got := AppendBatch(nil, rows)
	var a, b []map[string]any
	if err := json.Unmarshal(got, &a); err != nil {
		t.Fatalf("AppendBatch wrote invalid JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal(want, &b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("AppendBatch:\n%s\nencoding/json:\n%s", got, want)
	}
	// And the database reads it back unchanged: covered by every enqueue
	// test; control characters in kinds by this one.
}
