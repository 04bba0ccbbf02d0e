package core

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/relayq/relay/internal/jobinsert"
)

// MaxTags is the most tags a job may carry.
const MaxTags = 32

// validateKind checks a job kind the way Enqueue and AddWorker both need:
// 1 to 255 bytes of UTF-8 without NUL (PostgreSQL text cannot hold NUL).
// holder names the type whose Kind method returned it.
func validateKind(kind string, holder any) error {
	if kind == "" {
		return &ValidationError{Field: "kind", Reason: fmt.Sprintf("%T.Kind() returned an empty string", holder)}
	}
	return validateName("kind", kind, 255)
}

// validateName checks a non-empty text value stored in a text column:
// valid UTF-8, no NUL byte, at most max bytes. Empty passes (callers
// decide what empty means).
func validateName(field, s string, max int) error {
	if reason := jobinsert.NameProblem(s, max); reason != "" {
		return &ValidationError{Field: field, Reason: reason}
	}
	return nil
}

// validateTags checks tags and returns them without duplicates, in the
// order given (nil for none).
func validateTags(tags []string) ([]string, error) {
	if len(tags) == 0 {
		return nil, nil
	}
	out := make([]string, 0, len(tags))
	for _, t := range tags {
		if t == "" {
			return nil, &ValidationError{Field: "tags", Reason: "a tag is empty"}
		}
		if err := validateName("tags", t, 255); err != nil {
			return nil, err
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	if len(out) > MaxTags {
		return nil, &ValidationError{Field: "tags", Reason: fmt.Sprintf("%d tags; at most %d", len(out), MaxTags)}
	}
	return out, nil
}

// hasJSONNul reports whether encoded JSON holds the escape \u0000, which
// PostgreSQL's jsonb refuses (SQLSTATE 22P05). An escape counts when the
// backslash before "u0000" is not itself escaped.
func hasJSONNul(b []byte) bool {
	for i := 0; i+6 <= len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		if string(b[i+1:i+6]) == "u0000" {
			return true
		}
		i++ // skip the escaped character (a second backslash included)
	}
	return false
}

// sanitizeText makes s storable in a PostgreSQL text column: invalid UTF-8
// becomes U+FFFD and a NUL byte (which text cannot hold, SQLSTATE 22021
// either way) becomes the visible escape \x00. Error messages, stacks and
// panic values pass through it before they are written, so that a failure
// is recorded whatever bytes its message holds.
func sanitizeText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", `\x00`)
}

// validate refuses settings that no default can mend: negative durations
// and sizes where negative means nothing (a negative ticker period panics
// a background goroutine; a negative LIMIT fails every statement).
// Negative RescueInterval, Retention.Interval and retention periods are
// meaningful (disabled, keep forever) and pass.
func (cf *Config) validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"LeaseDuration", cf.LeaseDuration},
		{"HeartbeatInterval", cf.HeartbeatInterval},
		{"PollInterval", cf.PollInterval},
		{"EnqueueWakeCoalesce", cf.EnqueueWakeCoalesce},
		{"LivenessTimeout", cf.LivenessTimeout},
	} {
		if d.v < 0 {
			return fmt.Errorf("core: new client: %s %s is negative", d.name, d.v)
		}
	}
	if cf.LivenessTimeout > 0 && cf.LivenessTimeout < time.Second {
		return fmt.Errorf("core: new client: LivenessTimeout %s is below 1s (it heartbeats every quarter of it)", cf.LivenessTimeout)
	}
	if cf.EnqueueWakeCoalesce > maxEnqueueWakeCoalesce {
		return fmt.Errorf("core: new client: EnqueueWakeCoalesce %s is above %s", cf.EnqueueWakeCoalesce, maxEnqueueWakeCoalesce)
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"FetchLimit", cf.FetchLimit},
		{"Retention.BatchSize", cf.Retention.BatchSize},
	} {
		if n.v < 0 {
			return fmt.Errorf("core: new client: %s %d is negative", n.name, n.v)
		}
	}
	if cf.FetchLimit > math.MaxInt32 || cf.Retention.BatchSize > math.MaxInt32 {
		return fmt.Errorf("core: new client: FetchLimit %d or Retention.BatchSize %d is above %d", cf.FetchLimit, cf.Retention.BatchSize, math.MaxInt32)
	}
	for name, qc := range cf.Queues {
		if name == "" {
			return errors.New("core: new client: a queue name is empty")
		}
		if err := validateName("queue", name, 128); err != nil {
			return fmt.Errorf("core: new client: queue %q: %w", name, err)
		}
		if qc.MaxWorkers < 0 || qc.Prefetch < 0 {
			return fmt.Errorf("core: new client: queue %q: MaxWorkers %d and Prefetch %d must not be negative", name, qc.MaxWorkers, qc.Prefetch)
		}
	}
	return nil
}
