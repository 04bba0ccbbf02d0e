# Relay's two entry points. Both need Go and PostgreSQL's server binaries
# (initdb/pg_ctl); neither needs a running server.
GO ?= go

.PHONY: demo test vet build

# Run the demo: on $DATABASE_URL, or a throwaway local PostgreSQL.
demo:
	$(GO) run ./cmd/relay demo

# Run every test with the race detector, against real PostgreSQL:
# $RELAY_TEST_DATABASE_URL, else localhost:5432, else a throwaway cluster
# (cmd/relay, whose proofs open many connections, prefers a throwaway cluster).
test:
	$(GO) test -race -count=1 -timeout 20m ./...

vet:
	$(GO) vet ./...

build:
	$(GO) build -o bin/relay ./cmd/relay
