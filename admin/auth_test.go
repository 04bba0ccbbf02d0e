package admin

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/core"
	"github.com/relayq/relay/testkit/testdb"
)

// TestJWKS: RS256 and ES256 tokens verify against a JWKS file by kid; an
// algorithm that does not match the key's type, an HS256 token "signed"
// with the public key, and an unknown kid are refused.
func TestJWKS(t *testing.T) {
	t.Parallel()
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
	set := map[string]any{"keys": []map[string]string{
		{"kty": "RSA", "kid": "r1", "n": enc(rsaKey.N.Bytes()), "e": enc(big.NewInt(int64(rsaKey.E)).Bytes())},
		{"kty": "EC", "kid": "e1", "crv": "P-256", "x": enc(ecKey.X.FillBytes(make([]byte, 32))), "y": enc(ecKey.Y.FillBytes(make([]byte, 32)))},
	}}
	path := filepath.Join(t.TempDir(), "jwks.json")
	b, _ := json.Marshal(set)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := Handler(testdb.New(t), &Config{Auth: &Auth{Issuer: "idp", Audience: "relay", JWKSFile: path}})
	if err != nil {
		t.Fatal(err)
	}
	claims := jwt.MapClaims{"iss": "idp", "aud": "relay", "sub": "bob", "scope": "relay:read",
		"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()}
	sign := func(m jwt.SigningMethod, kid string, key any) string {
		tok := jwt.NewWithClaims(m, claims)
		if kid != "" {
			tok.Header["kid"] = kid
		}
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	pubDER, _ := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	cases := []struct {
		name  string
		token string
		want  int
	}{
		{"RS256 by kid", sign(jwt.SigningMethodRS256, "r1", rsaKey), 200},
		{"ES256 by kid", sign(jwt.SigningMethodES256, "e1", ecKey), 200},
		{"RS256 naming the EC key", sign(jwt.SigningMethodRS256, "e1", rsaKey), 401},
		{"ES256 naming the RSA key", sign(jwt.SigningMethodES256, "r1", ecKey), 401},
		{"HS256 keyed with the public key", sign(jwt.SigningMethodHS256, "r1", pubDER), 401},
		{"RS384", sign(jwt.SigningMethodRS384, "r1", rsaKey), 401},
		{"unknown kid", sign(jwt.SigningMethodRS256, "nope", rsaKey), 401},
		{"no kid with two keys", sign(jwt.SigningMethodRS256, "", rsaKey), 401},
	}
	for _, c := range cases {
		req := httptest.NewRequest("GET", "/v1/audit", nil)
		req.Header.Set("Authorization", "Bearer "+c.token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != c.want {
			t.Errorf("%s: %d, want %d: %s", c.name, rec.Code, c.want, rec.Body)
		}
		if c.want != 200 && rec.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: not a problem body", c.name)
		}
	}
}

// TestAuthConfig: unusable configurations fail at construction, not at the
// first request.
func TestAuthConfig(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	long := []byte(strings.Repeat("s", 32))
	for name, cfg := range map[string]*Config{
		"nothing":           {},
		"nil":               nil,
		"both":              {NoAuth: true, Auth: &Auth{Issuer: "i", Audience: "a", HS256Secret: long}},
		"no issuer":         {Auth: &Auth{Audience: "a", HS256Secret: long}},
		"no audience":       {Auth: &Auth{Issuer: "i", HS256Secret: long}},
		"short secret":      {Auth: &Auth{Issuer: "i", Audience: "a", HS256Secret: []byte("short")}},
		"no key":            {Auth: &Auth{Issuer: "i", Audience: "a"}},
		"secret and JWKS":   {Auth: &Auth{Issuer: "i", Audience: "a", HS256Secret: long, JWKSFile: "x"}},
		"missing JWKS file": {Auth: &Auth{Issuer: "i", Audience: "a", JWKSFile: "/nonexistent"}},
		"huge leeway":       {Auth: &Auth{Issuer: "i", Audience: "a", HS256Secret: long, Leeway: time.Hour}},
	} {
		if _, err := Handler(pool, cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestLeeway: a token expired within the leeway passes; beyond it, not.
func TestLeeway(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if r := b.do("GET", "/v1/audit", b.token(TokenOpts{TTL: -10 * time.Second}), nil); r.Status != http.StatusOK {
		t.Fatalf("expired 10s ago (leeway 30s): %d %s", r.Status, r.Body)
	}
	b.problem(b.do("GET", "/v1/audit", b.token(TokenOpts{TTL: -2 * time.Minute}), nil), 401)
	// The scheme is case-insensitive; another scheme is refused.
	for scheme, want := range map[string]int{"bearer": 200, "BEARER": 200, "Basic": 401, "": 401} {
		req := httptest.NewRequest("GET", "/v1/audit", nil)
		req.Header.Set("Authorization", strings.TrimSpace(scheme+" "+b.rw))
		rec := httptest.NewRecorder()
		b.h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("scheme %q: %d, want %d", scheme, rec.Code, want)
		}
	}
	// A token without exp is refused.
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"iss": testIssuer, "aud": testAudience, "sub": "x", "scope": "relay:read"})
	s, _ := tok.SignedString(testSecret)
	b.problem(b.do("GET", "/v1/audit", s, nil), 401)
	// Nor one without a subject.
	tok = jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"iss": testIssuer, "aud": testAudience, "scope": "relay:read", "exp": time.Now().Add(time.Hour).Unix()})
	s, _ = tok.SignedString(testSecret)
	b.problem(b.do("GET", "/v1/audit", s, nil), 401)
}

// TestHealth: /readyz is 503 on a database without the migrations and 200
// on a migrated one.
func TestHealth(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	Readyz(testdb.New(t)).ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != 200 {
		t.Fatalf("migrated: %d %s", rec.Code, rec.Body)
	}
	empty, err := pgxpoolNew(testdb.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	rec = httptest.NewRecorder()
	Readyz(empty).ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "not applied") || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("empty database: %d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	Healthz().ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != 200 {
		t.Fatal(rec.Code)
	}
}

func pgxpoolNew(url string) (*pgxpool.Pool, error) { return pgxpool.New(context.Background(), url) }

// TestEveryRouteChecksItsScope walks the OpenAPI document: every GET
// declares and needs relay:read (a write-only token is refused), every other
// method declares and needs relay:write (a read-only token is refused), and
// nothing changes in the database or the audit log.
func TestEveryRouteChecksItsScope(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wo := b.token(TokenOpts{Subject: "writer", Scopes: []string{ScopeWrite}})
	b.job("receipt.send", "mail", core.StateDead, "boom")
	var doc struct {
		Paths map[string]map[string]struct {
			Security []map[string][]string `json:"security"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(b.do("GET", "/openapi.json", "", nil).Body, &doc); err != nil {
		t.Fatal(err)
	}
	writes := 0
	for path, methods := range doc.Paths {
		for method, o := range methods {
			method = strings.ToUpper(method)
			want, wrong := ScopeWrite, b.ro
			if method == http.MethodGet {
				want, wrong = ScopeRead, wo
			} else {
				writes++
			}
			if len(o.Security) != 1 || !slices.Equal(o.Security[0]["bearer"], []string{want}) {
				t.Errorf("%s %s declares %v, want bearer %s", method, path, o.Security, want)
			}
			concrete := strings.NewReplacer("{id}", "1", "{name}", "x").Replace(path)
			if strings.HasPrefix(path, "/v1/idempotency-keys") {
				concrete += "?scope=s&key=k"
			}
			p := b.problem(b.do(method, concrete, wrong, nil), http.StatusForbidden)
			if !strings.Contains(p["detail"].(string), want) {
				t.Errorf("%s %s: 403 does not name %s: %v", method, path, want, p)
			}
		}
	}
	if writes < 10 {
		t.Fatalf("only %d write operations in the document", writes)
	}
	if n := b.count(`SELECT count(*) FROM relay_admin_audit`); n != 0 {
		t.Fatalf("%d audit rows after refused writes", n)
	}
	if n := b.count(`SELECT count(*) FROM relay_jobs WHERE state = 'dead'`); n != 1 {
		t.Fatal("a refused write changed the dead job")
	}
}

// TestTokenClaimsTheDatabaseCannotStore: a validly signed token whose sub
// the audit log cannot store (a NUL byte, longer than 200
// bytes) is refused with 401, not a 500 on its first write; and a token
// larger than 8 KiB is refused before it is parsed.
func TestTokenClaimsTheDatabaseCannotStore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, sub := range []string{"a\x00b", strings.Repeat("s", 201)} {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"iss": testIssuer, "aud": testAudience, "sub": sub,
			"scope": "relay:read relay:write", "exp": time.Now().Add(time.Hour).Unix()}).SignedString(testSecret)
		if err != nil {
			t.Fatal(err)
		}
		b.problem(b.do("POST", "/v1/queues/q/pause", tok, nil), http.StatusUnauthorized)
	}
	big := b.token(TokenOpts{Scopes: []string{ScopeRead, ScopeWrite, strings.Repeat("x", 8<<10)}})
	b.problem(b.do("GET", "/v1/audit", big, nil), http.StatusUnauthorized)
	if n := b.count(`SELECT count(*) FROM relay_queue_pauses`); n != 0 {
		t.Fatal("a refused token paused a queue")
	}
}

// TestReadyzDoesNotLeakTheConnection: /readyz needs no token, so when the
// database is unreachable its body says so without the connection's user,
// database name or host (the server log has them).
func TestReadyzDoesNotLeakTheConnection(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://secretuser@127.0.0.1:1/secretdb?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rec := httptest.NewRecorder()
	Readyz(pool).ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "database unreachable") {
		t.Fatalf("unreachable database: %d %s", rec.Code, rec.Body)
	}
	for _, secret := range []string{"secretuser", "secretdb", "127.0.0.1"} {
		if strings.Contains(rec.Body.String(), secret) {
			t.Errorf("/readyz body names %q: %s", secret, rec.Body)
		}
	}
}

// TestNoAuthRefusesBrowsersFromElsewhere: a handler without authentication
// is reachable by any web page its operator's browser opens. A page from
// another origin must not change anything (a cross-site form POST to
// …/pause needs no preflight), and a page that rebinds its own DNS name to
// 127.0.0.1 must not read anything (its requests carry its own Host).
// curl on the machine itself still works.
func TestNoAuthRefusesBrowsersFromElsewhere(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	h, err := Handler(pool, &Config{NoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	send := func(method, target, host string, header map[string]string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, nil)
		req.Host = host
		for k, v := range header {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, c := range []struct {
		name         string
		method, host string
		header       map[string]string
		want         int
	}{
		{"cross-site form post", "POST", "127.0.0.1:8080", map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, 403},
		{"cross-origin post from an old browser", "POST", "127.0.0.1:8080", map[string]string{"Origin": "https://evil.example"}, 403},
		{"DNS rebinding read", "GET", "evil.example:8080", nil, 403},
		{"DNS rebinding write", "POST", "evil.example:8080", map[string]string{"Sec-Fetch-Site": "same-origin"}, 403},
		{"curl", "POST", "127.0.0.1:8080", nil, 200},
		{"curl via localhost", "GET", "localhost:8080", nil, 200},
		{"curl over IPv6", "GET", "[::1]:8080", nil, 200},
		{"same-origin page (the dashboard)", "POST", "127.0.0.1:8080", map[string]string{"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"}, 200},
	} {
		target := "/v1/queues/default/pause"
		if c.method == "GET" {
			target = "/v1/jobs"
		}
		rec := send(c.method, target, c.host, c.header)
		if rec.Code != c.want {
			t.Errorf("%s: %d, want %d: %s", c.name, rec.Code, c.want, rec.Body)
		}
		if c.want == 403 && rec.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: not a problem body", c.name)
		}
		if c.want == 403 {
			if n := testdb.Count(t, pool, `SELECT count(*) FROM relay_queue_pauses`); n != 0 {
				t.Fatalf("%s paused the queue", c.name)
			}
		}
	}
}

// TestTokenTimes: a token without exp, or not valid yet (nbf or iat past
// the leeway in the future), is refused; one a few seconds ahead of our
// clock (within the leeway) is accepted.
func TestTokenTimes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	for _, c := range []struct {
		name string
		edit func(jwt.MapClaims)
		want int
	}{
		{"no exp", func(c jwt.MapClaims) { delete(c, "exp") }, 401},
		{"nbf in an hour", func(c jwt.MapClaims) { c["nbf"] = now.Add(time.Hour).Unix() }, 401},
		{"iat in an hour", func(c jwt.MapClaims) { c["iat"] = now.Add(time.Hour).Unix() }, 401},
		{"exp a minute ago", func(c jwt.MapClaims) { c["exp"] = now.Add(-time.Minute).Unix() }, 401},
		{"iat 5s ahead (clock skew)", func(c jwt.MapClaims) { c["iat"] = now.Add(5 * time.Second).Unix() }, 200},
		{"exp as a string", func(c jwt.MapClaims) { c["exp"] = "never" }, 401},
	} {
		claims := jwt.MapClaims{"iss": testIssuer, "aud": testAudience, "sub": "x", "scope": ScopeRead, "exp": now.Add(time.Hour).Unix()}
		c.edit(claims)
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(testSecret)
		if err != nil {
			t.Fatal(err)
		}
		if r := b.do("GET", "/v1/whoami", tok, nil); r.Status != c.want {
			t.Errorf("%s: %d, want %d: %s", c.name, r.Status, c.want, r.Body)
		}
	}
}
