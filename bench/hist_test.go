package bench

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Quantiles from the histogram stay within its 1.6% bucket error of the
// exact quantiles of the same values, and survive a JSON round trip and a
// merge.
func TestHistogramQuantiles(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var a, b Histogram
	var all []time.Duration
	for i := 0; i < 100000; i++ {
		d := time.Duration(r.ExpFloat64() * float64(2*time.Millisecond))
		all = append(all, d)
		if i%2 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	enc, err := json.Marshal(&b)
	if err != nil {
		t.Fatal(err)
	}
	var b2 Histogram
	if err := json.Unmarshal(enc, &b2); err != nil {
		t.Fatal(err)
	}
	a.Merge(&b2)
	if a.Count() != uint64(len(all)) {
		t.Fatalf("count %d, want %d", a.Count(), len(all))
	}
	var sum time.Duration
	for _, d := range all {
		sum += d
	}
	if a.Mean() != sum/time.Duration(len(all)) {
		t.Errorf("mean %s, want %s", a.Mean(), sum/time.Duration(len(all)))
	}
	slices.Sort(all)
	for _, q := range []float64{0.5, 0.95, 0.99, 0.999} {
		exact := all[int(q*float64(len(all)-1))]
		got := a.Quantile(q)
		if diff := float64(got-exact) / float64(exact); diff > 0.02 || diff < -0.02 {
			t.Errorf("q%.3f: got %s, exact %s (%.1f%% off)", q, got, exact, diff*100)
		}
	}
	if (&Histogram{}).Quantile(0.5) != 0 {
		t.Error("empty histogram quantile is not zero")
	}
}
