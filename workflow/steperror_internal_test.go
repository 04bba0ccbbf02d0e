package workflow

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// A stored error description rebuilds the same error on every call, with
// what could not be stored dropped the same way each time: details that
// are not JSON or too large (noted in the message), a code this registry
// has not declared.
func TestDescribeAndRebuildError(t *testing.T) {
	sentinel := errors.New("declined")
	r := NewRegistry(nil, nil)
	if err := r.DeclareError("declined", sentinel); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		err     error
		details string // the rebuilt *Error's details
		note    string // in the rebuilt *Error's message
	}{
		"valid details":     {err: &Error{Type: "t", Message: "m", Details: json.RawMessage(`{"a": 1}`)}, details: `{"a": 1}`},
		"invalid details":   {err: &Error{Type: "t", Message: "m", Details: json.RawMessage(`{"a":`)}, note: "details dropped: not valid JSON"},
		"oversized details": {err: &Error{Type: "t", Message: "m", Details: json.RawMessage(`"` + strings.Repeat("x", MaxErrorBytes) + `"`)}, note: "details dropped"},
	} {
		info, _ := r.describeError(fmt.Errorf("wrapped: %w", tc.err))
		for i := 0; i < 2; i++ {
			got, err := r.rebuildError("wrapped: m", info)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			var app *Error
			if !errors.As(got, &app) || app.Type != "t" || string(app.Details) != tc.details || !strings.Contains(app.Message, tc.note) {
				t.Fatalf("%s: rebuilt %#v from %s", name, app, info)
			}
			if got.Error() != "wrapped: m" || !errors.Is(got, &Error{Type: "t"}) || errors.Is(got, &Error{Type: "u"}) || errors.Is(got, &Error{}) {
				t.Fatalf("%s: %q matches wrongly", name, got)
			}
		}
	}
	// The sentinel, by errors.Is or by an *Error of its code; another
	// registry, which has not declared the code, matches nothing.
	for _, err := range []error{fmt.Errorf("x: %w", sentinel), &Error{Type: "declined"}} {
		info, _ := r.describeError(err)
		got, _ := r.rebuildError("x", info)
		if !errors.Is(got, sentinel) {
			t.Fatalf("%v (%s): the declared sentinel is not matched", err, info)
		}
		other, _ := NewRegistry(nil, nil).rebuildError("x", info)
		if errors.Is(other, sentinel) {
			t.Fatalf("%v: matched in a registry that did not declare it", err)
		}
	}
	// An error with nothing declared in it is stored as its message alone.
	if info, _ := r.describeError(errors.New("plain")); info != "" {
		t.Fatalf("a plain error described as %s", info)
	}
}
