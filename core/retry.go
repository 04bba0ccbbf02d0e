package core

import (
	"math"
	"math/rand/v2"
	"time"
)

// RetryPolicy decides how long a failed job waits before its next attempt.
// attempt is the number of the attempt that just failed (1 for the first).
type RetryPolicy interface {
	RetryDelay(attempt int, err error) time.Duration
}

// RetryPolicyFunc adapts a function to RetryPolicy.
type RetryPolicyFunc func(attempt int, err error) time.Duration

// RetryDelay calls f.
func (f RetryPolicyFunc) RetryDelay(attempt int, err error) time.Duration { return f(attempt, err) }

// Backoff is exponential backoff with jitter, capped: the delay after
// attempt n is Base·2^(n-1), at most Max, then reduced by a random fraction of
// up to Jitter (so retries of jobs that failed together spread out instead of
// stampeding). The zero value is Base 1s, Max 1h, Jitter 0.1.
type Backoff struct {
	Base   time.Duration
	Max    time.Duration
	Jitter float64 // 0..1; 0 means the default 0.1, negative means none
	// Rand returns a number in [0, 1); nil is math/rand/v2. Tests pin it.
	Rand func() float64
}

// RetryDelay implements RetryPolicy.
func (b Backoff) RetryDelay(attempt int, _ error) time.Duration {
	base, maxDelay, jitter := b.Base, b.Max, b.Jitter
	if base <= 0 {
		base = time.Second
	}
	if maxDelay <= 0 {
		maxDelay = time.Hour
	}
	switch {
	case jitter == 0:
		jitter = 0.1
	case jitter < 0:
		jitter = 0
	case jitter > 1:
		jitter = 1
	}
	if attempt < 1 {
		attempt = 1
	}
	d := float64(base) * math.Pow(2, float64(attempt-1))
	if d > float64(maxDelay) {
		d = float64(maxDelay)
	}
	r := b.Rand
	if r == nil {
		r = rand.Float64
	}
	return time.Duration(d * (1 - jitter*r()))
}
