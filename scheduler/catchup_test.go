package scheduler

import (
	"testing"
	"time"
)

func TestPlanFires(t *testing.T) {
	hourly, err := ParseSpec("0 * * * *", nil)
	if err != nil {
		t.Fatal(err)
	}
	every, err := ParseSpec("@every 10s", nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 5, 10, 12, 0, 5, 0, time.UTC)
	h := func(n int) time.Time {
		return time.Date(2026, 5, 10, 12, 0, 0, 0, time.UTC).Add(time.Duration(n) * time.Hour)
	}
	cases := []struct {
		name   string
		spec   *Spec
		first  time.Time
		grace  time.Duration
		keep   int
		fires  []time.Time
		next   time.Time
		missed int
	}{
		{"on time", hourly, h(0), 30 * time.Second, 1, []time.Time{h(0)}, h(1), 0},
		{"not due", hourly, h(1), 30 * time.Second, 1, nil, h(1), 0},
		{"latest of five missed", hourly, h(-5), time.Second, 1, []time.Time{h(0)}, h(1), 5},
		{"skip missed", hourly, h(-5), time.Second, 0, []time.Time{}, h(1), 6},
		{"all missed, bounded", hourly, h(-5), time.Second, 3, []time.Time{h(-2), h(-1), h(0)}, h(1), 3},
		{"all missed", hourly, h(-5), time.Second, 100, []time.Time{h(-5), h(-4), h(-3), h(-2), h(-1), h(0)}, h(1), 0},
		{"skip keeps on-time", hourly, h(-5), time.Minute, 0, []time.Time{h(0)}, h(1), 5},
		{"every: on time and missed", every, now.Add(-35 * time.Second), 12 * time.Second, 1,
			[]time.Time{now.Add(-15 * time.Second), now.Add(-5 * time.Second)}, now.Add(5 * time.Second), 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := planFires(c.spec, c.first, now, c.grace, c.keep)
			if len(p.fires) != len(c.fires) {
				t.Fatalf("fires %v, want %v", p.fires, c.fires)
			}
			for i := range c.fires {
				if !p.fires[i].Equal(c.fires[i]) {
					t.Fatalf("fires %v, want %v", p.fires, c.fires)
				}
			}
			if !p.next.Equal(c.next) {
				t.Errorf("next %s, want %s", p.next, c.next)
			}
			if c.missed > 0 && p.missed == 0 || c.missed == 0 && p.missed != 0 {
				t.Errorf("missed %d, want %d", p.missed, c.missed)
			}
		})
	}
}

// A schedule unfired for ten years is planned by looking back from now, not
// by walking every fire since: the result comes from a few hundred Next
// calls, not five million.
func TestPlanFiresLongDowntime(t *testing.T) {
	perMinute, err := ParseSpec("* * * * *", nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2036, 1, 1, 0, 0, 30, 0, time.UTC)
	first := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := planFires(perMinute, first, now, time.Second, 1)
	if len(p.fires) != 1 || !p.fires[0].Equal(time.Date(2036, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("fires %v", p.fires)
	}
	if !p.next.Equal(time.Date(2036, 1, 1, 0, 1, 0, 0, time.UTC)) {
		t.Errorf("next %s", p.next)
	}
}
