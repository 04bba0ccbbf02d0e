package jobinsert

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Row is one job as the insert statements read it: an element of the JSON
// array of their parameter (written by AppendBatch; the tags document the
// shape). Its fields are already checked: core's Enqueue validates them,
// and a layer that builds a Row itself checks what it sets.
type Row struct {
	Kind        string          `json:"kind"`
	Queue       string          `json:"queue"`
	Args        json.RawMessage `json:"args"`
	Priority    int             `json:"priority"`
	MaxAttempts int             `json:"max_attempts"`
	RunAt       *time.Time      `json:"run_at,omitempty"`
	DelayUS     int64           `json:"delay_us"`
	Metadata    json.RawMessage `json:"metadata"`
	OrderingKey *string         `json:"ordering_key,omitempty"`
	Tags        []string        `json:"tags,omitempty"`
	// Unique jobs only.
	UniqueKey    *string  `json:"unique_key,omitempty"`
	UniqueStates []string `json:"unique_states,omitempty"`
}

// RunsNow reports whether the job is runnable as soon as it is inserted
// (no delay, no run-at after now): only then does its insert wake the
// queue's workers.
func (r Row) RunsNow(now time.Time) bool {
	return r.DelayUS <= 0 && (r.RunAt == nil || !r.RunAt.After(now))
}

// AppendBatch writes rows as the JSON array the insert statements read. It
// is encoding/json's output for []Row, written directly: args and metadata
// are already JSON, and re-encoding them (encoding/json validates and
// compacts every RawMessage) was a tenth of a batch enqueue's time.
func AppendBatch(b []byte, rows []Row) []byte {
	b = append(b, '[')
	for i, r := range rows {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"kind":`...)
		b = appendString(b, r.Kind)
		b = append(b, `,"queue":`...)
		b = appendString(b, r.Queue)
		b = append(b, `,"args":`...)
		b = append(b, r.Args...)
		b = append(b, `,"priority":`...)
		b = strconv.AppendInt(b, int64(r.Priority), 10)
		b = append(b, `,"max_attempts":`...)
		b = strconv.AppendInt(b, int64(r.MaxAttempts), 10)
		if r.RunAt != nil {
			b = append(b, `,"run_at":"`...)
			b = r.RunAt.AppendFormat(b, time.RFC3339Nano)
			b = append(b, '"')
		}
		b = append(b, `,"delay_us":`...)
		b = strconv.AppendInt(b, r.DelayUS, 10)
		b = append(b, `,"metadata":`...)
		b = append(b, r.Metadata...)
		if r.OrderingKey != nil {
			b = append(b, `,"ordering_key":`...)
			b = appendString(b, *r.OrderingKey)
		}
		if len(r.Tags) > 0 {
			b = append(b, `,"tags":`...)
			b = appendStrings(b, r.Tags)
		}
		if r.UniqueKey != nil {
			b = append(b, `,"unique_key":`...)
			b = appendString(b, *r.UniqueKey)
			b = append(b, `,"unique_states":`...)
			b = appendStrings(b, r.UniqueStates)
		}
		b = append(b, '}')
	}
	return append(b, ']')
}

// appendStrings appends ss as a JSON array of strings.
func appendStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

// appendString appends s as a JSON string. s is valid UTF-8 (checked with
// the row), so only quotes, backslashes and control characters need
// escaping.
func appendString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// NameProblem says what is wrong with s as a name of a job's (its queue,
// a tag, an ordering key) at most max bytes long: "" when nothing is.
func NameProblem(s string, max int) string {
	switch {
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL byte"
	case len(s) > max:
		return fmt.Sprintf("longer than %d bytes", max)
	}
	return ""
}
