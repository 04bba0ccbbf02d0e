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
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/testdb"
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
