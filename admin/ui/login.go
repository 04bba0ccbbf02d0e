package ui

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"
)

// OneTimeLogin hands out short-lived login codes, each exchanged once for a
// token, as Jupyter's login link does: relay serve on a loopback address
// prints a link with a code in its fragment (never sent to a server, so in
// no log), the dashboard exchanges the code for a token at POST
// /ui/login, and the code is gone. The link is never a reusable token.
type OneTimeLogin struct {
	mint func() (string, error)

	mu    sync.Mutex
	codes map[[32]byte]time.Time // sha256 of a code → its expiry
}

// NewOneTimeLogin returns a OneTimeLogin whose codes are exchanged for a
// token that mint makes.
func NewOneTimeLogin(mint func() (string, error)) *OneTimeLogin {
	return &OneTimeLogin{mint: mint, codes: map[[32]byte]time.Time{}}
}

// NewCode returns a fresh random code valid for ttl (10 minutes when 0).
func (l *OneTimeLogin) NewCode(ttl time.Duration) string {
	if ttl <= 0 {
		ttl = 10 * time.Minute
	}
	code := rand.Text() // 26 base32 characters: 130 bits
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	for k, exp := range l.codes {
		if now.After(exp) {
			delete(l.codes, k)
		}
	}
	l.codes[sha256.Sum256([]byte(code))] = now.Add(ttl)
	return code
}

// errBadCode is the one answer to a wrong, used or expired code.
var errBadCode = errors.New("the login code is unknown, used or expired: ask relay serve for a new link (restart it) or paste a token")

// exchange consumes code and returns a token.
func (l *OneTimeLogin) exchange(code string) (string, error) {
	k := sha256.Sum256([]byte(code))
	l.mu.Lock()
	exp, ok := l.codes[k]
	delete(l.codes, k)
	l.mu.Unlock()
	if !ok || time.Now().After(exp) {
		return "", errBadCode
	}
	return l.mint()
}

// serveLogin answers POST /ui/login {"code": …} with {"token": …}, or a
// problem.
func (l *OneTimeLogin) serveLogin(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Code string `json:"code"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1024)).Decode(&in); err != nil || in.Code == "" {
		problem(w, r, http.StatusBadRequest, `the body must be {"code": "…"}`)
		return
	}
	tok, err := l.exchange(in.Code)
	if errors.Is(err, errBadCode) {
		problem(w, r, http.StatusForbidden, err.Error())
		return
	}
	if err != nil {
		problem(w, r, http.StatusInternalServerError, "could not make a token")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]string{"token": tok}) //nolint:errcheck // the client has gone if this fails
}

// problem writes an RFC 9457 body, as the API does.
func problem(w http.ResponseWriter, r *http.Request, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{ //nolint:errcheck // the client has gone if this fails
		"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail, "instance": r.URL.Path,
	})
}
