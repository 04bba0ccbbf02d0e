package workflow

import "testing"

// TestHistCachePutCountsAReplacedRunOnce replaces a run's kept history
// while the bound evicts: the count of kept steps must stay the sum of the
// histories kept, or the bound no longer bounds them.
func TestHistCachePutCountsAReplacedRunOnce(t *testing.T) {
	for range 20 { // map order decides whether the eviction meets the replaced run
		var c histCache
		c.put("a", &keptHistory{steps: make([]stepRow, histCacheMaxSteps/2)})
		c.put("b", &keptHistory{steps: make([]stepRow, histCacheMaxSteps/2)})
		c.put("a", &keptHistory{steps: make([]stepRow, histCacheMaxSteps/2+1)})
		sum := 0
		for _, k := range c.runs {
			sum += len(k.steps)
		}
		if c.steps != sum {
			t.Fatalf("counted %d kept steps, %d kept (runs %d)", c.steps, sum, len(c.runs))
		}
		if sum > histCacheMaxSteps {
			t.Fatalf("%d steps kept, bound %d", sum, histCacheMaxSteps)
		}
	}
}
