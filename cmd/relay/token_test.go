package main

import (
	"strings"
	"testing"
)

// TestTokenLifetimeIsBounded: relay token mints a token of up to 24 hours
// and refuses a longer --ttl with an error that says the maximum and why.
func TestTokenLifetimeIsBounded(t *testing.T) {
	t.Setenv(secretEnv, "0123456789abcdef0123456789abcdef-token-test")
	if err := runToken([]string{"--subject", "oncall", "--ttl", "24h"}); err != nil {
		t.Fatalf("--ttl 24h: %v", err)
	}
	for _, ttl := range []string{"24h0m1s", "720h", "8760h"} {
		err := runToken([]string{"--subject", "oncall", "--ttl", ttl})
		if err == nil || !strings.Contains(err.Error(), "maximum of 24h0m0s") || !strings.Contains(err.Error(), "revoked") {
			t.Errorf("--ttl %s: %v, want a refusal naming the 24h maximum and why", ttl, err)
		}
	}
}
