package appname

import "testing"

// A name is the role after the user's name, then the id, cut to 63 bytes.
func TestFor(t *testing.T) {
	if got := For("", "serve", ""); got != "relay-serve" {
		t.Errorf("For without a user's name or id: %q", got)
	}
	if got := For("billing", "worker", "host-1"); got != "billing relay-worker host-1" {
		t.Errorf("For with a user's name and an id: %q", got)
	}
	long := For("an-application-name-that-is-rather-long-indeed", "dispatcher", "host-1234-abcdef")
	if len(long) != 63 {
		t.Errorf("For is %d bytes, want it cut to 63: %q", len(long), long)
	}
}
