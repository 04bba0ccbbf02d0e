package admin

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/golang-jwt/jwt/v5"
)

// The scopes a token may carry, space-separated in its "scope" claim.
const (
	// ScopeRead allows every GET.
	ScopeRead = "relay:read"
	// ScopeWrite allows every change (POST, DELETE).
	ScopeWrite = "relay:write"
)

// DefaultLeeway is the clock skew allowed on exp, nbf and iat.
const DefaultLeeway = 30 * time.Second

// maxLeeway bounds Auth.Leeway: a large leeway is an expiry not enforced.
const maxLeeway = 5 * time.Minute

// Auth says which bearer tokens the API accepts. Exactly one key source is
// given: HS256Secret (a shared secret; tokens must be HS256) or JWKSFile
// (public keys; tokens must be RS256 or ES256 and match their key's type).
// The algorithm is pinned by the key source, so a token cannot switch it
// (no "none", no HS256 signed with a public key). Every token must carry exp,
// the configured iss and aud, and a sub naming who acts (the audit log
// records it).
type Auth struct {
	Issuer   string
	Audience string
	// HS256Secret is the shared secret of HS256 tokens (at least 32 bytes).
	HS256Secret []byte
	// JWKSFile is a JSON Web Key Set file of RSA and EC P-256 public keys.
	// Tokens name their key by kid (optional when the set has one key).
	JWKSFile string
	// Leeway is the clock skew allowed. Default DefaultLeeway; at most 5m.
	Leeway time.Duration
}

// claims are the claims the API reads.
type claims struct {
	jwt.RegisteredClaims
	// Scope is space-separated, as in OAuth 2.0 (RFC 8693 §4.2).
	Scope string `json:"scope,omitempty"`
}

// UnmarshalJSON reads the claims strictly: a key named twice is refused
// (which of the two would count differs between parsers), and exp, nbf
// and iat must be JSON numbers (RFC 7519 §2: seconds since 1970). jwt's own
// decoding also takes a string holding digits, so {"exp": "99999999999"}
// would pass as a number to one reader and be refused by another.
func (c *claims) UnmarshalJSON(b []byte) error {
	if err := checkNoDuplicateKeys(b); err != nil {
		return err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	for _, k := range []string{"exp", "nbf", "iat"} {
		v, ok := raw[k]
		if !ok {
			continue
		}
		d := json.NewDecoder(bytes.NewReader(v))
		d.UseNumber()
		var x any
		if err := d.Decode(&x); err != nil {
			return fmt.Errorf("claim %s: %w", k, err)
		}
		if _, ok := x.(json.Number); !ok {
			return fmt.Errorf("claim %s must be a number (seconds since 1970), not %s", k, v)
		}
	}
	type plain claims // without this method
	return json.Unmarshal(b, (*plain)(c))
}

// verifier checks tokens against one Auth.
type verifier struct {
	parser  *jwt.Parser
	keyfunc jwt.Keyfunc
}

func newVerifier(a *Auth) (*verifier, error) {
	if a.Issuer == "" || a.Audience == "" {
		return nil, errors.New("admin: auth needs an issuer and an audience")
	}
	leeway := a.Leeway
	if leeway == 0 {
		leeway = DefaultLeeway
	}
	if leeway < 0 || leeway > maxLeeway {
		return nil, fmt.Errorf("admin: auth leeway %s out of range (0, %s]", a.Leeway, maxLeeway)
	}
	var methods []string
	var kf jwt.Keyfunc
	switch {
	case len(a.HS256Secret) > 0 && a.JWKSFile != "":
		return nil, errors.New("admin: auth takes a shared secret or a JWKS file, not both")
	case len(a.HS256Secret) > 0:
		if len(a.HS256Secret) < 32 {
			return nil, errors.New("admin: the HS256 secret must be at least 32 bytes")
		}
		methods = []string{jwt.SigningMethodHS256.Alg()}
		secret := slices.Clone(a.HS256Secret)
		kf = func(*jwt.Token) (any, error) { return secret, nil }
	case a.JWKSFile != "":
		keys, err := loadJWKS(a.JWKSFile)
		if err != nil {
			return nil, err
		}
		methods = []string{jwt.SigningMethodRS256.Alg(), jwt.SigningMethodES256.Alg()}
		kf = keys.keyfunc
	default:
		return nil, errors.New("admin: auth needs an HS256 secret or a JWKS file")
	}
	return &verifier{
		parser: jwt.NewParser(
			jwt.WithValidMethods(methods),
			jwt.WithExpirationRequired(),
			jwt.WithIssuedAt(),
			jwt.WithLeeway(leeway),
			jwt.WithIssuer(a.Issuer),
			jwt.WithAudience(a.Audience),
		),
		keyfunc: kf,
	}, nil
}

// maxTokenBytes bounds a bearer token: tokens are a few hundred bytes to a
// few KiB; a larger one is refused before it is decoded.
const maxTokenBytes = 8 << 10

// maxSubjectBytes bounds the sub claim the audit log records.
const maxSubjectBytes = 200

// verify checks a token and returns its subject and scopes.
func (v *verifier) verify(token string) (string, []string, error) {
	if len(token) > maxTokenBytes {
		return "", nil, fmt.Errorf("token longer than %d bytes", maxTokenBytes)
	}
	var c claims
	if _, err := v.parser.ParseWithClaims(token, &c, v.keyfunc); err != nil {
		return "", nil, err
	}
	if c.Subject == "" {
		return "", nil, errors.New("token has no sub claim")
	}
	if len(c.Subject) > maxSubjectBytes || !cleanText(c.Subject) {
		return "", nil, fmt.Errorf("the sub claim must be UTF-8 without NUL bytes, at most %d bytes", maxSubjectBytes)
	}
	return c.Subject, strings.Fields(c.Scope), nil
}

// jwks holds the public keys of a JWKS file, by kid.
type jwks struct {
	keys map[string]any // *rsa.PublicKey or *ecdsa.PublicKey
}

func loadJWKS(path string) (*jwks, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("admin: read JWKS: %w", err)
	}
	var set struct {
		Keys []struct {
			Kty string `json:"kty"`
			Kid string `json:"kid"`
			Crv string `json:"crv"`
			N   string `json:"n"`
			E   string `json:"e"`
			X   string `json:"x"`
			Y   string `json:"y"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("admin: parse JWKS %s: %w", path, err)
	}
	out := &jwks{keys: map[string]any{}}
	for i, k := range set.Keys {
		var key any
		switch k.Kty {
		case "RSA":
			n, err1 := b64int(k.N)
			e, err2 := b64int(k.E)
			if err := errors.Join(err1, err2); err != nil || !e.IsInt64() || n.BitLen() < 2048 {
				return nil, fmt.Errorf("admin: JWKS key %d: bad RSA key (2048 bits or more)", i)
			}
			key = &rsa.PublicKey{N: n, E: int(e.Int64())}
		case "EC":
			if k.Crv != "P-256" {
				return nil, fmt.Errorf("admin: JWKS key %d: curve %q (only P-256, for ES256)", i, k.Crv)
			}
			x, err1 := b64int(k.X)
			y, err2 := b64int(k.Y)
			if err := errors.Join(err1, err2); err != nil || !elliptic.P256().IsOnCurve(x, y) { //nolint:staticcheck // validating a public point
				return nil, fmt.Errorf("admin: JWKS key %d: bad EC point", i)
			}
			key = &ecdsa.PublicKey{Curve: elliptic.P256(), X: x, Y: y}
		default:
			return nil, fmt.Errorf("admin: JWKS key %d: key type %q (RSA or EC)", i, k.Kty)
		}
		if _, dup := out.keys[k.Kid]; dup {
			return nil, fmt.Errorf("admin: JWKS: two keys with kid %q", k.Kid)
		}
		out.keys[k.Kid] = key
	}
	if len(out.keys) == 0 {
		return nil, fmt.Errorf("admin: JWKS %s holds no keys", path)
	}
	return out, nil
}

func b64int(s string) (*big.Int, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) == 0 {
		return nil, errors.New("bad base64url integer")
	}
	return new(big.Int).SetBytes(b), nil
}

// keyfunc picks the token's key by kid and refuses an algorithm that does
// not match the key's type.
func (k *jwks) keyfunc(t *jwt.Token) (any, error) {
	kid, _ := t.Header["kid"].(string)
	key, ok := k.keys[kid]
	if !ok && kid == "" && len(k.keys) == 1 {
		for _, only := range k.keys {
			key, ok = only, true
		}
	}
	if !ok {
		return nil, fmt.Errorf("no key with kid %q", kid)
	}
	switch key.(type) {
	case *rsa.PublicKey:
		if t.Method.Alg() != jwt.SigningMethodRS256.Alg() {
			return nil, fmt.Errorf("key %q is RSA; token is %s", kid, t.Method.Alg())
		}
	case *ecdsa.PublicKey:
		if t.Method.Alg() != jwt.SigningMethodES256.Alg() {
			return nil, fmt.Errorf("key %q is EC; token is %s", kid, t.Method.Alg())
		}
	}
	return key, nil
}

// TokenOpts describes a token for MintToken.
type TokenOpts struct {
	Issuer   string
	Audience string
	// Subject names who acts; the audit log records it.
	Subject string
	// Scopes default to relay:read and relay:write.
	Scopes []string
	// TTL defaults to one hour.
	TTL time.Duration
}

// MintToken signs an HS256 token with secret: a development token for relay
// token and tests. Production tokens come from an identity provider.
func MintToken(secret []byte, o TokenOpts) (string, error) {
	if len(secret) < 32 {
		return "", errors.New("admin: the HS256 secret must be at least 32 bytes")
	}
	if o.Subject == "" || o.Issuer == "" || o.Audience == "" {
		return "", errors.New("admin: a token needs a subject, an issuer and an audience")
	}
	scopes := o.Scopes
	if scopes == nil {
		scopes = []string{ScopeRead, ScopeWrite}
	}
	ttl := o.TTL
	if ttl == 0 {
		ttl = time.Hour
	}
	now := time.Now()
	c := claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: o.Issuer, Subject: o.Subject, Audience: jwt.ClaimStrings{o.Audience},
			IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
		Scope: strings.Join(scopes, " "),
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
}

// subjectKey carries the authenticated subject in a request's context.
type subjectKey struct{}

// scopesKey carries the token's scopes in a request's context.
type scopesKey struct{}

// subject is who makes the request, for the audit log.
func subject(ctx context.Context) string {
	s, _ := ctx.Value(subjectKey{}).(string)
	return s
}

// scopes are the request's token's scopes.
func scopes(ctx context.Context) []string {
	s, _ := ctx.Value(scopesKey{}).([]string)
	return s
}

// authenticate is the middleware that bounds the request's time
// (Config.RequestTimeout) and checks the bearer token and the scope the
// operation needs, before the request body is read.
func (s *server) authenticate(api huma.API) func(huma.Context, func(huma.Context)) {
	return func(ctx huma.Context, next func(huma.Context)) {
		bounded, cancel := context.WithTimeout(ctx.Context(), s.cfg.RequestTimeout)
		defer cancel()
		ctx = huma.WithContext(ctx, bounded)
		need := ScopeWrite
		if ctx.Operation().Method == http.MethodGet {
			need = ScopeRead
		}
		if s.verifier == nil {
			if !s.withinRate(api, ctx, "") || !s.bodyAllowed(api, ctx) {
				return
			}
			next(huma.WithValue(huma.WithValue(ctx, subjectKey{}, "anonymous"), scopesKey{}, []string{ScopeRead, ScopeWrite}))
			return
		}
		scheme, token, _ := strings.Cut(ctx.Header("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" { // the scheme is case-insensitive (RFC 9110 §11.1)
			ctx.SetHeader("WWW-Authenticate", `Bearer realm="relay"`)
			huma.WriteErr(api, ctx, http.StatusUnauthorized, "a bearer token is required (Authorization: Bearer <JWT>)") //nolint:errcheck // logged by huma
			return
		}
		sub, scopes, err := s.verifier.verify(strings.TrimSpace(token))
		if err != nil {
			ctx.SetHeader("WWW-Authenticate", `Bearer realm="relay", error="invalid_token"`)
			huma.WriteErr(api, ctx, http.StatusUnauthorized, "invalid token: "+err.Error()) //nolint:errcheck // logged by huma
			return
		}
		if !s.withinRate(api, ctx, token) {
			return
		}
		if !slices.Contains(scopes, need) {
			ctx.SetHeader("WWW-Authenticate", `Bearer realm="relay", error="insufficient_scope", scope="`+need+`"`)
			huma.WriteErr(api, ctx, http.StatusForbidden, "the token lacks scope "+need) //nolint:errcheck // logged by huma
			return
		}
		if !s.bodyAllowed(api, ctx) {
			return
		}
		next(huma.WithValue(huma.WithValue(ctx, subjectKey{}, sub), scopesKey{}, scopes))
	}
}

// withinRate takes the request from its token's bucket (Config.RateLimit),
// or answers 429 with Retry-After.
func (s *server) withinRate(api huma.API, ctx huma.Context, token string) bool {
	if s.limiter == nil {
		return true
	}
	ok, wait := s.limiter.allow(strings.TrimSpace(token))
	if ok {
		return true
	}
	secs := retryAfter(wait)
	ctx.SetHeader("Retry-After", strconv.Itoa(secs))
	huma.WriteErr(api, ctx, http.StatusTooManyRequests, fmt.Sprintf("this token's requests are over the server's rate limit "+ //nolint:errcheck // logged by huma
		"(%g per second, bursts of %g): try again in %d s", s.limiter.rate, s.limiter.burst, secs))
	return false
}

// bodyAllowed refuses (400) a request body sent to an operation that takes
// none, which would otherwise be ignored: `POST …/requeue` with
// {"dry_run":true} must not requeue for real.
func (s *server) bodyAllowed(api huma.API, ctx huma.Context) bool {
	if ctx.Operation().RequestBody != nil {
		return true
	}
	var one [1]byte
	if n, _ := io.ReadFull(ctx.BodyReader(), one[:]); n == 0 {
		return true
	}
	huma.WriteErr(api, ctx, http.StatusBadRequest, ctx.Operation().Method+" "+ctx.Operation().Path+" takes no request body") //nolint:errcheck // logged by huma
	return false
}
