package bench

import (
	"encoding/json"
	"math/bits"
	"time"
)

// Histogram counts durations in log-linear buckets: 64 per power of two, so
// a percentile is within 1.6% of the true value, in fixed memory (about
// 30 KiB) however many values it holds.
type Histogram struct {
	counts [59 * subBuckets]uint64
	n      uint64
	sum    time.Duration
}

const subBuckets = 64

func bucket(v uint64) int {
	if v < subBuckets {
		return int(v)
	}
	shift := bits.Len64(v) - 7 // v>>shift is in [64, 128)
	return (shift+1)*subBuckets + int(v>>shift) - subBuckets
}

// lowest returns the smallest value that falls in bucket i.
func lowest(i int) uint64 {
	if i < subBuckets {
		return uint64(i)
	}
	shift := i/subBuckets - 1
	return uint64(i%subBuckets+subBuckets) << shift
}

// Record adds one duration (negative counts as zero).
func (h *Histogram) Record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucket(uint64(d))]++
	h.n++
	h.sum += d
}

// Mean is the exact mean of the values recorded (zero when empty).
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}

// Count is the number of values recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
}

// Quantile returns the value at quantile q (0..1), as the midpoint of its
// bucket; zero when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n-1)) + 1
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := lowest(i), lowest(i+1)
			return time.Duration((lo + hi) / 2)
		}
	}
	return 0
}

type histJSON struct {
	Buckets map[int]uint64 `json:"b"`
	Sum     time.Duration  `json:"s"`
}

// MarshalJSON writes the non-empty buckets only.
func (h *Histogram) MarshalJSON() ([]byte, error) {
	m := map[int]uint64{}
	for i, c := range h.counts {
		if c > 0 {
			m[i] = c
		}
	}
	return json.Marshal(histJSON{Buckets: m, Sum: h.sum})
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (h *Histogram) UnmarshalJSON(b []byte) error {
	var j histJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*h = Histogram{sum: j.Sum}
	for i, c := range j.Buckets {
		if i >= 0 && i < len(h.counts) {
			h.counts[i] += c
			h.n += c
		}
	}
	return nil
}
