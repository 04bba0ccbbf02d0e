package admin_test

import (
	"context"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/admin"
)

// Mount the admin API under /relay/ in a service's own mux, next to its
// workers, accepting tokens from the service's identity provider.
func ExampleHandler() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	h, err := admin.Handler(pool, &admin.Config{
		Auth: &admin.Auth{
			Issuer:   "https://idp.example.com/",
			Audience: "relay-admin",
			JWKSFile: "/etc/relay/jwks.json", // RS256/ES256 public keys
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/relay/", http.StripPrefix("/relay", h))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}

// Mint a development token for a shared-secret setup (relay token does the
// same from the command line).
func ExampleMintToken() {
	token, err := admin.MintToken([]byte(os.Getenv("RELAY_JWT_SECRET")), admin.TokenOpts{
		Issuer:   "relay",
		Audience: "relay-admin",
		Subject:  "oncall@example.com",
		Scopes:   []string{admin.ScopeRead}, // read-only
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = token // send as "Authorization: Bearer " + token
}
