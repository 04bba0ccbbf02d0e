package admin

import (
	"crypto/sha256"
	"math"
	"sync"
	"time"
)

// rateLimiter is a token bucket per bearer token (Config.RateLimit): each
// bucket holds up to burst requests and refills at rate per second. Only
// tokens that verified get a bucket, so the map holds one entry per valid
// token in use; buckets full again (idle for burst/rate) are dropped when
// the map grows.
type rateLimiter struct {
	rate  float64 // requests per second
	burst float64
	now   func() time.Time

	mu      sync.Mutex
	buckets map[[32]byte]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

// maxBuckets is the bucket count past which full buckets are swept.
const maxBuckets = 10000

func newRateLimiter(rate float64, burst int) *rateLimiter {
	return &rateLimiter{rate: rate, burst: float64(burst), now: time.Now, buckets: map[[32]byte]*bucket{}}
}

// allow takes one request from token's bucket. When the bucket is empty it
// returns false and how long until it holds a request again.
func (l *rateLimiter) allow(token string) (bool, time.Duration) {
	key := sha256.Sum256([]byte(token)) // the map keeps no token
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[key]
	if !ok {
		if len(l.buckets) >= maxBuckets {
			l.sweep(now)
		}
		b = &bucket{tokens: l.burst, last: now}
		l.buckets[key] = b
	}
	if elapsed := now.Sub(b.last).Seconds(); elapsed > 0 {
		b.tokens = math.Min(l.burst, b.tokens+elapsed*l.rate)
	}
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// sweep drops the buckets that have refilled: forgetting them changes
// nothing.
func (l *rateLimiter) sweep(now time.Time) {
	for k, b := range l.buckets {
		if b.tokens+now.Sub(b.last).Seconds()*l.rate >= l.burst {
			delete(l.buckets, k)
		}
	}
}

// retryAfter is a Retry-After value: whole seconds, at least 1.
func retryAfter(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}
