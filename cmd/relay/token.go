package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/relayq/relay/admin"
)

// Defaults shared by relay serve and relay token, so a token minted with
// the defaults is accepted by a server started with them.
const (
	defaultIssuer   = "relay"
	defaultAudience = "relay-admin"
	secretEnv       = "RELAY_JWT_SECRET"
)

// maxTokenTTL bounds relay token's --ttl. A token signed with the shared
// secret cannot be revoked one by one: only rotating $RELAY_JWT_SECRET
// ends it, and that ends every token at once. A day covers a working day
// or an on-call shift, so a leaked development token is worth a day at
// most; anything meant to live longer should come from an identity
// provider (relay serve --jwks-file), which can rotate and revoke.
const maxTokenTTL = 24 * time.Hour

// runToken mints a development HS256 token from the secret in
// $RELAY_JWT_SECRET (never a flag: command lines show in ps) and prints it.
func runToken(args []string) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	subject := fs.String("subject", os.Getenv("USER"), "who the token acts as (recorded in the audit log)")
	scope := fs.String("scope", admin.ScopeRead+" "+admin.ScopeWrite, "space-separated scopes")
	ttl := fs.Duration("ttl", time.Hour, "how long the token is valid (at most 24h)")
	issuer := fs.String("issuer", defaultIssuer, "iss claim (relay serve --issuer)")
	audience := fs.String("audience", defaultAudience, "aud claim (relay serve --audience)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	secret := os.Getenv(secretEnv)
	if secret == "" {
		return errors.New("token: set $" + secretEnv + " to the secret relay serve uses (at least 32 bytes)")
	}
	if *subject == "" {
		return errors.New("token: --subject is required")
	}
	if *ttl <= 0 {
		return errors.New("token: --ttl must be positive")
	}
	if *ttl > maxTokenTTL {
		return fmt.Errorf("token: --ttl %s is longer than the maximum of %s: a token signed with $%s can only be "+
			"revoked by rotating the secret (which ends every token); mint a new one tomorrow, or issue longer-lived "+
			"tokens from an identity provider (relay serve --jwks-file)", *ttl, maxTokenTTL, secretEnv)
	}
	tok, err := admin.MintToken([]byte(secret), admin.TokenOpts{
		Issuer: *issuer, Audience: *audience, Subject: *subject, Scopes: strings.Fields(*scope), TTL: *ttl,
	})
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	fmt.Println(tok)
	return nil
}
