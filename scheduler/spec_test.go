package scheduler_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/scheduler"
)

func mustLoad(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// fires lists the first n fire times after from.
func fires(t *testing.T, spec string, loc *time.Location, from time.Time, n int) []time.Time {
	t.Helper()
	s, err := scheduler.ParseSpec(spec, loc)
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	for i := 0; i < n; i++ {
		from = s.Next(from)
		if from.IsZero() {
			t.Fatalf("%s: no fire after %d", spec, i)
		}
		out = append(out, from)
	}
	return out
}

func fmtAll(ts []time.Time) string {
	var b []string
	for _, t := range ts {
		b = append(b, t.Format("2006-01-02 15:04:05 MST"))
	}
	return strings.Join(b, ", ")
}

func TestSpecNext(t *testing.T) {
	utc := time.UTC
	start := time.Date(2023, 12, 15, 12, 0, 0, 0, utc)
	cases := []struct {
		name, spec string
		from       time.Time
		want       string
	}{
		{"five fields", "30 9 * * 1-5", start,
			"2023-12-18 09:30:00 UTC, 2023-12-19 09:30:00 UTC, 2023-12-20 09:30:00 UTC"},
		{"seconds field", "15 * * * * *", start,
			"2023-12-15 12:00:15 UTC, 2023-12-15 12:01:15 UTC, 2023-12-15 12:02:15 UTC"},
		{"descriptor", "@monthly", start,
			"2024-01-01 00:00:00 UTC, 2024-02-01 00:00:00 UTC, 2024-03-01 00:00:00 UTC"},
		{"every", "@every 90s", start,
			"2023-12-15 12:01:30 UTC, 2023-12-15 12:03:00 UTC, 2023-12-15 12:04:30 UTC"},
		// L across a leap February (2024) and a common one (2025).
		{"last day, leap year", "0 2 L * *", start,
			"2023-12-31 02:00:00 UTC, 2024-01-31 02:00:00 UTC, 2024-02-29 02:00:00 UTC"},
		{"last day, common year", "0 2 L * *", time.Date(2025, 1, 31, 3, 0, 0, 0, utc),
			"2025-02-28 02:00:00 UTC, 2025-03-31 02:00:00 UTC, 2025-04-30 02:00:00 UTC"},
		{"last day, February 2100 is not leap", "0 0 L 2 *", time.Date(2099, 3, 1, 0, 0, 0, 0, utc),
			"2100-02-28 00:00:00 UTC"},
		// LW: 2024-03-31 is a Sunday → Fri 29th; 2024-08-31 a Saturday →
		// Fri 30th; 2024-02-29 a Thursday stays.
		{"last weekday", "0 18 LW * *", time.Date(2024, 2, 1, 0, 0, 0, 0, utc),
			"2024-02-29 18:00:00 UTC, 2024-03-29 18:00:00 UTC, 2024-04-30 18:00:00 UTC"},
		{"last weekday, Saturday month-end", "0 18 LW 8 ?", time.Date(2024, 1, 1, 0, 0, 0, 0, utc),
			"2024-08-30 18:00:00 UTC"},
		{"dom or dow when both restricted", "0 0 1 * MON", time.Date(2024, 4, 1, 1, 0, 0, 0, utc),
			"2024-04-08 00:00:00 UTC, 2024-04-15 00:00:00 UTC, 2024-04-22 00:00:00 UTC, 2024-04-29 00:00:00 UTC, 2024-05-01 00:00:00 UTC"},
		{"CRON_TZ prefix", "CRON_TZ=Asia/Tokyo 0 9 * * *", start,
			"2023-12-16 09:00:00 JST"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := strings.Count(c.want, ",") + 1
			got := fmtAll(fires(t, c.spec, nil, c.from, n))
			if got != c.want {
				t.Errorf("%s from %s:\n got %s\nwant %s", c.spec, c.from, got, c.want)
			}
		})
	}
}

// America/New_York: clocks jump 02:00 → 03:00 on 2026-03-08 and fall back
// 02:00 → 01:00 on 2026-11-01.
func TestSpecDaylightSaving(t *testing.T) {
	ny := mustLoad(t, "America/New_York")

	t.Run("spring forward: a skipped time fires once at the jump", func(t *testing.T) {
		got := fmtAll(fires(t, "30 2 * * *", ny, time.Date(2026, 3, 6, 12, 0, 0, 0, ny), 3))
		want := "2026-03-07 02:30:00 EST, 2026-03-08 03:00:00 EDT, 2026-03-09 02:30:00 EDT"
		if got != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	})
	t.Run("spring forward: every minute of the lost hour folds into one fire", func(t *testing.T) {
		got := fmtAll(fires(t, "*/20 * * * *", ny, time.Date(2026, 3, 8, 1, 30, 0, 0, ny), 4))
		want := "2026-03-08 01:40:00 EST, 2026-03-08 03:00:00 EDT, 2026-03-08 03:20:00 EDT, 2026-03-08 03:40:00 EDT"
		if got != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	})
	t.Run("fall back: a repeated time fires once, at its first occurrence", func(t *testing.T) {
		got := fires(t, "30 1 * * *", ny, time.Date(2026, 10, 31, 12, 0, 0, 0, ny), 2)
		want := "2026-11-01 01:30:00 EDT, 2026-11-02 01:30:00 EST"
		if fmtAll(got) != want {
			t.Errorf("got  %s\nwant %s", fmtAll(got), want)
		}
		if d := got[1].Sub(got[0]); d != 25*time.Hour {
			t.Errorf("fires are %s apart; the repeated 01:30 EST must not fire", d)
		}
	})
	t.Run("fall back: an hourly spec skips the repeated hour", func(t *testing.T) {
		got := fmtAll(fires(t, "0 * * * *", ny, time.Date(2026, 11, 1, 0, 30, 0, 0, ny), 3))
		want := "2026-11-01 01:00:00 EDT, 2026-11-01 02:00:00 EST, 2026-11-01 03:00:00 EST"
		if got != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	})
	t.Run("from inside the repeated hour", func(t *testing.T) {
		// 01:10 EST is the second 01:10; the 01:30 that follows was already
		// fired at its first occurrence (EDT), so the next fire is tomorrow.
		from := time.Date(2026, 11, 1, 6, 10, 0, 0, time.UTC)
		got := fmtAll(fires(t, "30 1 * * *", ny, from, 1))
		if want := "2026-11-02 01:30:00 EST"; got != want {
			t.Errorf("got %s want %s", got, want)
		}
	})
	t.Run("@every counts real time", func(t *testing.T) {
		got := fires(t, "@every 1h", ny, time.Date(2026, 11, 1, 0, 30, 0, 0, ny), 3)
		if got[1].Sub(got[0]) != time.Hour || got[2].Sub(got[1]) != time.Hour {
			t.Errorf("got %s", fmtAll(got))
		}
	})
}

func TestSpecErrors(t *testing.T) {
	cases := []struct{ spec, field, contains string }{
		{"", "", "empty"},
		{"0 70 * * *", "hour", "above maximum"},
		{"61 * * * *", "minute", "above maximum"},
		{"0 0 32 * *", "day-of-month", "above maximum"},
		{"0 0 * 13 *", "month", "above maximum"},
		{"0 0 * * 8", "day-of-week", "above maximum"},
		{"0 0 * * mon-xyz", "day-of-week", ""},
		{"0 2 L * 1", "day-of-week", "needs day-of-week"},
		{"0 2 15L * *", "day-of-month", "stand alone"},
		{"* * *", "", "has 3 fields"},
		{"@every 1.5s", "@every", "whole number"},
		{"@every soon", "@every", "not a duration"},
		{"@fortnightly", "", "unrecognized descriptor"},
		{"CRON_TZ=Mars/Olympus 0 0 * * *", "time zone", "unknown"},
		{"0 0 30 2 *", "", "never fires"},
	}
	for _, c := range cases {
		_, err := scheduler.ParseSpec(c.spec, nil)
		var se *scheduler.SpecError
		if !errors.As(err, &se) {
			t.Errorf("%q: got %v, want a *SpecError", c.spec, err)
			continue
		}
		if se.Field != c.field || !strings.Contains(err.Error(), c.contains) {
			t.Errorf("%q: got field %q, error %q; want field %q containing %q", c.spec, se.Field, err, c.field, c.contains)
		}
	}
}
