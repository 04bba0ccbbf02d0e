package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/relayq/relay/internal/jobinsert"
)

// error.type is a stable category for Relay's outcomes, else the type of
// the error beneath Relay's and fmt's wrappers.
func TestErrorTypeNamesTheUnderlyingError(t *testing.T) {
	var syntax *json.SyntaxError
	err := json.Unmarshal([]byte("{"), &map[string]any{})
	if !errors.As(err, &syntax) {
		t.Fatal("no syntax error")
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{RetryIn(0, fmt.Errorf("decode: %w", err)), "*json.SyntaxError"},
		{RetryIn(0, nil), "retry_in"},
		{fmt.Errorf("call: %w", context.DeadlineExceeded), "timeout"},
		{&PanicError{Value: "x"}, "panic"},
		{Permanent(errors.New("no")), "permanent"},
		{fmt.Errorf("%w: x", ErrLeaseLost), "lease_lost"},
		{Permanent(fmt.Errorf("%w 1: run_at", ErrUndecodableJob)), "undecodable"},
		{errors.New("plain"), "*errors.errorString"},
	} {
		if got := errorType(tc.err); got != tc.want {
			t.Errorf("errorType(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// Trace context is added to metadata without re-encoding the caller's
// values.
func TestWithTraceMetadataKeepsNumbers(t *testing.T) {
	got, err := withTraceMetadata(json.RawMessage(`{"order_id":1234567890123456789,"f":1.50}`), map[string]string{MetaTraceParent: "00-x"})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"f":1.50,"order_id":1234567890123456789,"traceparent":"00-x"}`; string(got) != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// The engine's insert keeps a traceparent the caller chose: its key is
// MetaTraceParent.
func TestWithTraceMetadataKeepsTheCallersTraceParent(t *testing.T) {
	if MetaTraceParent != jobinsert.TraceParentKey {
		t.Fatalf("MetaTraceParent %q, the insert's key %q", MetaTraceParent, jobinsert.TraceParentKey)
	}
	mine := json.RawMessage(`{"traceparent":"00-mine"}`)
	got, err := withTraceMetadata(mine, map[string]string{MetaTraceParent: "00-x"})
	if err != nil || string(got) != string(mine) {
		t.Fatalf("got %s (%v), want the caller's %s", got, err, mine)
	}
}
