package admin

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/relayq/relay/core"
)

// TestListJobsByTag: ?tag= keeps the jobs that carry every tag given, each
// listed with its tags, and the bulk filter's tags select the same jobs.
func TestListJobsByTag(t *testing.T) {
	t.Parallel()
	b := setup(t)
	enq := func(tags ...string) int64 {
		r, err := core.Enqueue(b.ctx, b.pool, testArgs{"tagged.kind"}, &core.EnqueueOpts{Queue: "mail", Tags: tags})
		if err != nil {
			t.Fatal(err)
		}
		return r.ID
	}
	acme := enq("tenant:acme")
	acmeVIP := enq("tenant:acme", "vip")
	enq("tenant:globex", "vip")
	enq()
	ids := func(path string) []int64 {
		var out []int64
		for _, it := range b.ok(b.do("GET", path, b.ro, nil))["items"].([]any) {
			out = append(out, int64(it.(map[string]any)["id"].(float64)))
		}
		return out
	}
	if got := ids("/v1/jobs?tag=tenant:acme"); len(got) != 2 || got[0] != acmeVIP || got[1] != acme {
		t.Fatalf("tag=tenant:acme: %v, want [%d %d]", got, acmeVIP, acme)
	}
	if got := ids("/v1/jobs?tag=tenant:acme&tag=vip"); len(got) != 1 || got[0] != acmeVIP {
		t.Fatalf("tag=tenant:acme&tag=vip: %v, want [%d]", got, acmeVIP)
	}
	if got := ids("/v1/jobs?tag=tenant:acme&queue=mail&state=queued"); len(got) != 2 {
		t.Fatalf("tag with queue and state: %v", got)
	}
	if got := ids("/v1/jobs?tag=nobody"); len(got) != 0 {
		t.Fatalf("tag=nobody: %v", got)
	}
	item := b.ok(b.do("GET", "/v1/jobs?tag=vip&tag=tenant:acme", b.ro, nil))["items"].([]any)[0].(map[string]any)
	if tags, _ := item["tags"].([]any); len(tags) != 2 || tags[0] != "tenant:acme" || tags[1] != "vip" {
		t.Fatalf("listed tags: %v", item["tags"])
	}
	b.problem(b.do("GET", "/v1/jobs?tag="+strings.Repeat("t", 256), b.ro, nil), http.StatusUnprocessableEntity)
	r := b.ok(b.do("POST", "/v1/jobs/bulk", b.rw, map[string]any{"action": "cancel", "dry_run": true,
		"filter": map[string]any{"tags": []string{"vip"}}}))
	if r["matched"].(float64) != 2 {
		t.Fatalf("bulk dry run on tag vip: %v", r)
	}
	b.ok(b.do("POST", "/v1/jobs/bulk", b.rw, map[string]any{"action": "cancel", "filter": map[string]any{"tags": []string{"tenant:acme", "vip"}}}))
	if b.state(acmeVIP) != "cancelled" || b.state(acme) != "queued" {
		t.Fatalf("bulk cancel by tags: %s %s", b.state(acmeVIP), b.state(acme))
	}
}

// TestListStopsAfterScanBound: a filter checked row by row (a kind that
// matches one job under 25,000 others) examines at most listScanRows jobs
// a page: the pages before the match come back empty with a next_cursor,
// the match is found by following them, and the last page has no cursor.
func TestListStopsAfterScanBound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rare := b.job("rare.kind", "q", core.StateSucceeded, "")
	b.exec(`ALTER TABLE relay_jobs DISABLE TRIGGER USER`)
	b.exec(`INSERT INTO relay_jobs (kind, queue, state, attempt, attempted_at, finalized_at)
		SELECT 'bulk.kind', 'q', 'succeeded', 1, now(), now() + g * interval '1 ms' FROM generate_series(1, 25000) AS g`)
	b.exec(`ALTER TABLE relay_jobs ENABLE TRIGGER USER`)
	for _, base := range []string{"/v1/jobs?kind=rare.kind", "/v1/jobs?state=succeeded&kind=rare.kind"} {
		path, pages, found := base, 0, false
		for {
			pages++
			page := b.ok(b.do("GET", path, b.ro, nil))
			items := page["items"].([]any)
			for _, it := range items {
				if int64(it.(map[string]any)["id"].(float64)) == rare {
					found = true
				}
			}
			next, _ := page["next_cursor"].(string)
			if next == "" {
				break
			}
			if found {
				t.Fatalf("%s: a cursor after the last match's page", base)
			}
			if pages > 10 {
				t.Fatalf("%s: more than 10 pages", base)
			}
			path = base + "&cursor=" + url.QueryEscape(next)
		}
		// 25,001 jobs at 10,000 a page: the match is on the third.
		if !found || pages != 3 {
			t.Fatalf("%s: found %v after %d pages, want found on page 3", base, found, pages)
		}
	}
	// Without a row-by-row condition every page is full: no bound.
	page := b.ok(b.do("GET", "/v1/jobs?state=succeeded&limit=500", b.ro, nil))
	if len(page["items"].([]any)) != 500 || page["next_cursor"] == nil {
		t.Fatalf("plain list: %d items", len(page["items"].([]any)))
	}
}

// TestOutboxKeyOfABlockedKey: an ordering key the outbox made
// (kind|endpoint|event key) is listed with its event key and subscriber,
// not only in that internal form; any other key is left as it is.
func TestOutboxKeyOfABlockedKey(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		key, kind, args    string
		eventKey, subscrib string
	}{
		{"ledger.post||order-9", "ledger.post", `{"event_id": 4, "key": "order-9"}`, "order-9", "ledger.post"},
		{"relay.webhook|https://hooks.example/in|order-9", "relay.webhook", `{"endpoint": "https://hooks.example/in"}`, "order-9", "https://hooks.example/in"},
		{"ledger.post||a|b", "ledger.post", `{}`, "a|b", "ledger.post"},
		{"account-17", "ledger.post", `{}`, "", ""},
		{"other.kind||order-9", "ledger.post", `{}`, "", ""},
		{"ledger.post||", "ledger.post", `{}`, "", ""},
	} {
		ek, sub := outboxKey(c.key, &core.JobRow{Kind: c.kind, EncodedArgs: []byte(c.args)})
		if ek != c.eventKey || sub != c.subscrib {
			t.Errorf("%q of %s: (%q, %q), want (%q, %q)", c.key, c.kind, ek, sub, c.eventKey, c.subscrib)
		}
	}
}
