package admin

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/relayq/relay/core"
)

// TestDuplicateKeyBodyIsRefused: a bulk requeue whose body says dry_run
// both true and false is refused with a 400 problem naming the key, and
// requeues nothing (encoding/json alone keeps the last value: it ran for
// real). A key repeated deeper in the body is refused too; the same key in
// two different objects is not a duplicate.
func TestDuplicateKeyBodyIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dead := b.job("receipt.send", "mail", core.StateDead, "boom")
	for _, body := range []string{
		`{"action":"requeue","filter":{},"dry_run":true,"dry_run":false}`,
		`{"action":"requeue","dry_run":false,"filter":{"queue":"mail","queue":"other"}}`,
		`{"action":"requeue","action":"delete","filter":{},"dry_run":true}`,
	} {
		p := b.problem(b.do("POST", "/v1/jobs/bulk", b.rw, body), http.StatusBadRequest)
		if !strings.Contains(string(mustJSON(p)), "duplicate key") {
			t.Errorf("%s: the problem does not say duplicate key: %v", body, p)
		}
	}
	if s := b.state(dead); s != "dead" {
		t.Fatalf("job is %s after refused bodies", s)
	}
	if n := b.count(`SELECT count(*) FROM relay_admin_audit`); n != 0 {
		t.Fatalf("%d audit rows after refused bodies", n)
	}
	// Keys that repeat across objects are fine; the dry run counts, the real
	// run requeues.
	r := b.ok(b.do("POST", "/v1/jobs/bulk", b.rw, `{"action":"requeue","dry_run":true,"filter":{"queue":"mail","state":"dead"}}`))
	if r["matched"].(float64) != 1 || b.state(dead) != "dead" {
		t.Fatalf("dry run: %v, job %s", r, b.state(dead))
	}
	b.ok(b.do("POST", "/v1/jobs/bulk", b.rw, `{"action":"requeue","filter":{"queue":"mail"}}`))
	if s := b.state(dead); s == "dead" {
		t.Fatal("the real run did not requeue")
	}
}

func TestCheckNoDuplicateKeys(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"a":1,"b":{"a":2},"c":[{"a":1},{"a":2}]}`: "",
		`{"a":1,"a":1}`:                    `duplicate key "a" in a JSON object (at a)`,
		`{"f":{"x":1,"x":2}}`:              `(at f.x)`,
		`[{"k":1},{"k":1,"k":2}]`:          `(at [1].k)`,
		`{"l":[[],[{"z":{"q":1,"q":2}}]]}`: `(at l[1][0].z.q)`,
		`{"a":1,`:                          "", // a syntax error is the decoder's to report
		`"just a string"`:                  "",
	} {
		err := checkNoDuplicateKeys([]byte(body))
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", body, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}

// TestTokenTimesMustBeNumbers: exp, nbf and iat are JSON numbers. jwt's
// own decoding takes a string of digits as a number; such a token is
// refused, and so is one that names a claim twice.
func TestTokenTimesMustBeNumbers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	later := time.Now().Add(time.Hour).Unix()
	sign := func(payload string) string {
		tok := jwt.New(jwt.SigningMethodHS256)
		head, _ := tok.SigningString()
		head = head[:strings.IndexByte(head, '.')]
		unsigned := head + "." + b64(payload)
		sig, err := jwt.SigningMethodHS256.Sign(unsigned, testSecret)
		if err != nil {
			t.Fatal(err)
		}
		return unsigned + "." + b64(string(sig))
	}
	base := `"iss":"` + testIssuer + `","aud":"` + testAudience + `","sub":"x","scope":"relay:read"`
	ok := sign(`{` + base + `,"exp":` + itoa(later) + `}`)
	if r := b.do("GET", "/v1/whoami", ok, nil); r.Status != 200 {
		t.Fatalf("a well-formed token: %d %s", r.Status, r.Body)
	}
	for name, payload := range map[string]string{
		"exp as a string of digits": `{` + base + `,"exp":"` + itoa(later) + `"}`,
		"nbf as a string":           `{` + base + `,"exp":` + itoa(later) + `,"nbf":"0"}`,
		"iat as a string":           `{` + base + `,"exp":` + itoa(later) + `,"iat":"0"}`,
		"exp as null":               `{` + base + `,"exp":null}`,
		"exp twice":                 `{` + base + `,"exp":1,"exp":` + itoa(later) + `}`,
		"sub twice":                 `{` + base + `,"sub":"y","exp":` + itoa(later) + `}`,
	} {
		r := b.do("GET", "/v1/whoami", sign(payload), nil)
		b.problem(r, http.StatusUnauthorized)
		if name == "exp as a string of digits" && !strings.Contains(string(r.Body), "must be a number") {
			t.Errorf("%s: %s", name, r.Body)
		}
	}
}
