package scheduler

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Spec is a parsed cron spec: when a schedule fires.
//
// The syntax is robfig/cron/v3's: five fields (minute hour day-of-month month
// day-of-week), or six with seconds first; descriptors (@yearly, @monthly,
// @weekly, @daily, @hourly, @every 90s); an optional CRON_TZ=Zone prefix.
// Two additions for month-end work, allowed as the whole day-of-month field
// with day-of-week left as * or ?:
//
//	L    the last day of the month          0 2 L * *
//	LW   the last weekday (Mon–Fri) of it   0 18 LW * *
//
// Wall-clock specs follow the spec's time zone across daylight-saving
// changes: a time that does not exist on a spring-forward day fires once, at
// the instant the clocks jump (02:30 → 03:00); a time that occurs twice on a
// fall-back day fires once, at its first occurrence. @every specs count real
// time and ignore the wall clock.
type Spec struct {
	text  string
	loc   *time.Location
	every time.Duration // @every; the rest is unused when set

	sched   *cron.SpecSchedule
	lastDay lastDay
}

type lastDay int

const (
	notLast        lastDay = iota
	lastOfMonth            // L
	lastWeekdayOfM         // LW
)

// SpecError is a cron spec that does not parse; Field names the part at
// fault ("minute", "day-of-month", "time zone", ...) when one is.
type SpecError struct {
	Spec   string
	Field  string
	Value  string
	Reason string
}

func (e *SpecError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("cron spec %q: %s", e.Spec, e.Reason)
	}
	return fmt.Sprintf("cron spec %q: %s field %q: %s", e.Spec, e.Field, e.Value, e.Reason)
}

var (
	fieldNames6 = []string{"second", "minute", "hour", "day-of-month", "month", "day-of-week"}
	// parser6 reads six fields; five-field specs get "0" seconds prepended.
	parser6 = cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
)

// ParseSpec parses a cron spec whose wall-clock times are read in loc (nil
// means UTC). A CRON_TZ= prefix in the spec overrides loc.
func ParseSpec(spec string, loc *time.Location) (*Spec, error) {
	if loc == nil {
		loc = time.UTC
	}
	s := &Spec{text: spec, loc: loc}
	rest := strings.TrimSpace(spec)
	if rest == "" {
		return nil, &SpecError{Spec: spec, Reason: "empty"}
	}
	if strings.HasPrefix(rest, "CRON_TZ=") || strings.HasPrefix(rest, "TZ=") {
		tz, after, _ := strings.Cut(rest[strings.Index(rest, "=")+1:], " ")
		l, err := time.LoadLocation(tz)
		if err != nil || tz == "" {
			return nil, &SpecError{Spec: spec, Field: "time zone", Value: tz, Reason: "unknown time zone"}
		}
		s.loc, rest = l, strings.TrimSpace(after)
		if rest == "" {
			return nil, &SpecError{Spec: spec, Reason: "nothing after the time zone"}
		}
	}

	if strings.HasPrefix(rest, "@") {
		if d, ok := strings.CutPrefix(rest, "@every "); ok {
			every, err := time.ParseDuration(strings.TrimSpace(d))
			if err != nil {
				return nil, &SpecError{Spec: spec, Field: "@every", Value: d, Reason: "not a duration"}
			}
			if every < time.Second || every%time.Second != 0 {
				return nil, &SpecError{Spec: spec, Field: "@every", Value: d, Reason: "must be a whole number of seconds, at least 1s"}
			}
			s.every = every
			return s, nil
		}
		sched, err := parser6.Parse(rest)
		if err != nil {
			return nil, &SpecError{Spec: spec, Reason: err.Error()}
		}
		s.sched = sched.(*cron.SpecSchedule)
		return s, nil
	}

	fields := strings.Fields(rest)
	switch len(fields) {
	case 5:
		fields = append([]string{"0"}, fields...)
	case 6:
	default:
		return nil, &SpecError{Spec: spec, Reason: fmt.Sprintf("has %d fields; want 5 (minute hour day-of-month month day-of-week), 6 (seconds first) or a @descriptor", len(fields))}
	}
	switch strings.ToUpper(fields[3]) {
	case "L":
		s.lastDay = lastOfMonth
	case "LW":
		s.lastDay = lastWeekdayOfM
	}
	if s.lastDay != notLast {
		if fields[5] != "*" && fields[5] != "?" {
			return nil, &SpecError{Spec: spec, Field: "day-of-week", Value: fields[5],
				Reason: fields[3] + " in day-of-month needs day-of-week to be * or ?"}
		}
		fields[3] = "*"
	} else if strings.ContainsAny(strings.ToUpper(fields[3]), "LW") {
		return nil, &SpecError{Spec: spec, Field: "day-of-month", Value: fields[3], Reason: "L and LW must stand alone in day-of-month"}
	}

	// Parse each field on its own first, so an error can name it.
	for i, f := range fields {
		probe := []string{"*", "*", "*", "*", "*", "*"}
		probe[i] = f
		if _, err := parser6.Parse(strings.Join(probe, " ")); err != nil {
			return nil, &SpecError{Spec: spec, Field: fieldNames6[i], Value: f, Reason: err.Error()}
		}
	}
	sched, err := parser6.Parse(strings.Join(fields, " "))
	if err != nil {
		return nil, &SpecError{Spec: spec, Reason: err.Error()}
	}
	s.sched = sched.(*cron.SpecSchedule)
	if s.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero() {
		return nil, &SpecError{Spec: spec, Reason: "never fires (no date matches it)"}
	}
	return s, nil
}

// String returns the spec as written.
func (s *Spec) String() string { return s.text }

// Location is the time zone the spec's wall-clock fields are read in.
func (s *Spec) Location() *time.Location { return s.loc }

// Next returns the first fire time strictly after t, or the zero time if
// there is none within five years.
func (s *Spec) Next(t time.Time) time.Time {
	if s.every > 0 {
		return t.Truncate(time.Second).Add(s.every)
	}
	// Walk candidate wall-clock times (held as UTC values, which have no
	// daylight-saving gaps) and map each to an instant in the zone. Mapping
	// can move a candidate (a skipped time moves to the jump) or fold two
	// onto one (a repeated time maps to its first occurrence), so keep
	// walking until an instant lands after t.
	wall := wallClock(t.In(s.loc)).Add(time.Second)
	limit := wall.AddDate(5, 0, 0)
	for wall.Before(limit) {
		wall = s.nextWall(wall, limit)
		if wall.IsZero() {
			return time.Time{}
		}
		if inst := resolve(wall, s.loc); inst.After(t) {
			return inst
		}
		wall = wall.Add(time.Second)
	}
	return time.Time{}
}

// wallClock returns t's wall-clock reading (to the second) as a UTC value.
func wallClock(t time.Time) time.Time {
	y, mo, d := t.Date()
	h, mi, sec := t.Clock()
	return time.Date(y, mo, d, h, mi, sec, 0, time.UTC)
}

// resolve maps a wall-clock time in loc to the instant it names: the first
// occurrence if it occurs twice, the end of the gap if it does not occur.
func resolve(wall time.Time, loc *time.Location) time.Time {
	// The offsets in force a day either side cover any one transition.
	_, before := wall.Add(-26 * time.Hour).In(loc).Zone()
	_, after := wall.Add(26 * time.Hour).In(loc).Zone()
	var found []time.Time
	for _, off := range []int{before, after} {
		inst := wall.Add(-time.Duration(off) * time.Second).In(loc)
		if _, o := inst.Zone(); o == off && (len(found) == 0 || !found[0].Equal(inst)) {
			found = append(found, inst)
		}
	}
	switch len(found) {
	case 0:
		// In a gap: read with the earlier offset, the time lands past the
		// jump; the zone period it lands in starts at the jump.
		inst := wall.Add(-time.Duration(before) * time.Second).In(loc)
		start, _ := inst.ZoneBounds()
		return start
	case 1:
		return found[0]
	default:
		if found[1].Before(found[0]) {
			return found[1]
		}
		return found[0]
	}
}

// nextWall returns the first wall-clock time at or after t (a UTC value,
// whole seconds) that matches the spec's fields, or zero past limit.
func (s *Spec) nextWall(t, limit time.Time) time.Time {
	c := s.sched
WRAP:
	if t.After(limit) {
		return time.Time{}
	}
	for 1<<uint(t.Month())&c.Month == 0 {
		t = time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, time.UTC)
		if t.Month() == time.January {
			goto WRAP
		}
	}
	for !s.dayMatches(t) {
		t = time.Date(t.Year(), t.Month(), t.Day()+1, 0, 0, 0, 0, time.UTC)
		if t.Day() == 1 {
			goto WRAP
		}
	}
	for 1<<uint(t.Hour())&c.Hour == 0 {
		t = t.Truncate(time.Hour).Add(time.Hour)
		if t.Hour() == 0 {
			goto WRAP
		}
	}
	for 1<<uint(t.Minute())&c.Minute == 0 {
		t = t.Truncate(time.Minute).Add(time.Minute)
		if t.Minute() == 0 {
			goto WRAP
		}
	}
	for 1<<uint(t.Second())&c.Second == 0 {
		t = t.Add(time.Second)
		if t.Second() == 0 {
			goto WRAP
		}
	}
	return t
}

// starBit marks a field written as * (robfig/cron's convention).
const starBit = 1 << 63

func (s *Spec) dayMatches(t time.Time) bool {
	var domMatch bool
	switch s.lastDay {
	case lastOfMonth:
		domMatch = t.Day() == daysIn(t)
	case lastWeekdayOfM:
		domMatch = t.Day() == lastWeekday(t)
	default:
		domMatch = 1<<uint(t.Day())&s.sched.Dom != 0
	}
	dowMatch := 1<<uint(t.Weekday())&s.sched.Dow != 0
	// Cron's rule: when both day fields are restricted, either may match.
	if s.lastDay == notLast && s.sched.Dom&starBit == 0 && s.sched.Dow&starBit == 0 {
		return domMatch || dowMatch
	}
	return domMatch && dowMatch
}

// daysIn returns the number of days in t's month.
func daysIn(t time.Time) int {
	return time.Date(t.Year(), t.Month()+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// lastWeekday returns the day of the month of its last Monday–Friday.
func lastWeekday(t time.Time) int {
	last := time.Date(t.Year(), t.Month(), daysIn(t), 0, 0, 0, 0, time.UTC)
	switch last.Weekday() {
	case time.Saturday:
		return last.Day() - 1
	case time.Sunday:
		return last.Day() - 2
	}
	return last.Day()
}
