// Package idempotency will hold an idempotency-key table and helpers that let
// handlers make each side effect once under at-least-once delivery: for
// database effects inside the caller's transaction, for calls to outside
// services with a stable token, and for HTTP producers (Idempotency-Key).
//
// Not built yet.
package idempotency
