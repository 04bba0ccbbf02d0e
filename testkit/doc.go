// Package testkit holds the repository's own test and development
// harnesses: testdb (a database per test), devpg (throwaway clusters,
// PgBouncer, standbys), netfault (a TCP proxy that drops and stalls) and
// browsertest (headless Chromium). They are what Relay's tests, proofs and
// demo stand on, not an API for users: for testing a handler, see relaytest.
// No library package imports them.
package testkit
