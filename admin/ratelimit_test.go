package admin

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/relayq/relay/testkit/testdb"
)

// TestRateLimitPerToken: with Config.RateLimit, each token gets its burst
// and then a 429 problem with Retry-After, while another token is still
// served; without RateLimit nothing is limited.
func TestRateLimitPerToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// One request per 1000 s: the burst is all a token gets in the test,
	// however slow the machine.
	h, err := Handler(b.pool, &Config{Auth: &Auth{Issuer: testIssuer, Audience: testAudience, HS256Secret: testSecret},
		RateLimit: 0.001, RateBurst: 3})
	if err != nil {
		t.Fatal(err)
	}
	unlimited := b.h
	b.h = h
	for range 3 {
		b.ok(b.do("GET", "/v1/queues", b.rw, nil))
	}
	r := b.do("GET", "/v1/queues", b.rw, nil)
	b.problem(r, http.StatusTooManyRequests)
	if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || s < 900 || s > 1000 {
		t.Fatalf("Retry-After %q, want about 1000 s", r.Header.Get("Retry-After"))
	}
	// A change is refused before it runs.
	b.problem(b.do("POST", "/v1/queues/mail/pause", b.rw, nil), http.StatusTooManyRequests)
	if n := b.count(`SELECT count(*) FROM relay_queue_pauses`); n != 0 {
		t.Fatal("a rate-limited pause paused the queue")
	}
	// Another token has its own bucket; a bad token is a 401, not counted.
	b.ok(b.do("GET", "/v1/queues", b.ro, nil))
	b.problem(b.do("GET", "/v1/queues", "not-a-token", nil), http.StatusUnauthorized)
	// The handler without RateLimit serves the limited token.
	b.h = unlimited
	for range 20 {
		b.ok(b.do("GET", "/v1/queues", b.rw, nil))
	}
}

// TestRateLimitRefills: a bucket refills at the rate, up to the burst.
func TestRateLimitRefills(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	l := newRateLimiter(2, 4)
	l.now = func() time.Time { return now }
	for i := range 4 {
		if ok, _ := l.allow("a"); !ok {
			t.Fatalf("request %d of the burst refused", i+1)
		}
	}
	ok, wait := l.allow("a")
	if ok || wait != 500*time.Millisecond || retryAfter(wait) != 1 {
		t.Fatalf("over the burst: %v, wait %s", ok, wait)
	}
	now = now.Add(500 * time.Millisecond)
	if ok, _ := l.allow("a"); !ok {
		t.Fatal("not refilled after 1/rate")
	}
	now = now.Add(time.Hour) // refills to the burst, not beyond
	for i := range 4 {
		if ok, _ := l.allow("a"); !ok {
			t.Fatalf("request %d after an idle hour refused", i+1)
		}
	}
	if ok, _ := l.allow("a"); ok {
		t.Fatal("the bucket held more than its burst")
	}
	// Full buckets are swept once the map is large.
	for i := range maxBuckets {
		l.allow(strconv.Itoa(i))
	}
	now = now.Add(time.Hour)
	l.allow("new")
	if len(l.buckets) > 2 {
		t.Fatalf("%d buckets after a sweep", len(l.buckets))
	}
}

// TestRateLimitConfig: a negative or non-finite rate is refused.
func TestRateLimitConfig(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	for _, c := range []Config{{NoAuth: true, RateLimit: -1}, {NoAuth: true, RateLimit: 1, RateBurst: -1}} {
		if _, err := Handler(pool, &c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
