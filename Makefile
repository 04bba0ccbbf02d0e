# Relay's two entry points. Both need Go and PostgreSQL's server binaries
# (initdb/pg_ctl); neither needs a running server.
GO ?= go
# pipefail: make test fails when go test does, whatever its summary says.
SHELL := bash

.PHONY: demo test vet build

# Run the demo: on $DATABASE_URL, or a throwaway local PostgreSQL.
demo:
	$(GO) run ./cmd/relay demo

# Run every test with the race detector, against real PostgreSQL:
# $RELAY_TEST_DATABASE_URL, else a throwaway cluster per test package
# (localhost:5432 only without initdb). Modules are fetched first, so a
# later run works offline; testsummary prints each package's line, the
# output of failed tests only, and what was skipped and why.
test:
	$(GO) mod download
	set -o pipefail; $(GO) test -race -count=1 -timeout 20m -json ./... | $(GO) run ./tools/testsummary

vet:
	$(GO) vet ./...

build:
	$(GO) build -o bin/relay ./cmd/relay
