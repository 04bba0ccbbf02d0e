// Package idempotency makes a side effect happen once per key, on top of
// Relay's at-least-once delivery. It keeps one row per (scope, key) in
// relay_idempotency_keys.
//
//   - Once, for effects in the database: it runs a function inside the
//     caller's transaction unless the key already succeeded, and stores the
//     function's result with the key in that same transaction. Exactly once:
//     the effect and the key commit together or not at all. A second call
//     replays the stored result; a concurrent call waits, then replays.
//   - External, for calls to outside services (email, payments): it commits
//     the key as running under a lease, calls the function with a token that
//     stays the same across attempts, then records the result. At least
//     once: a crash after the call and before the record runs the call
//     again, with the same token, which the outside service must use to
//     deduplicate (its Idempotency-Key header, say), or which the function
//     must check before acting.
//   - Middleware, for HTTP endpoints that enqueue work: it honours an
//     Idempotency-Key header, replaying the stored response for a repeated
//     request and refusing (422) the same key with a different request.
//
// Keys expire (Options.TTL, never before their lease ends). External and
// Middleware delete expired keys themselves, a bounded batch now and then as
// new keys arrive, in their own transactions; Once writes only its key in
// the caller's transaction, so its expired keys need a Cleaner (or
// DeleteExpired, which removes them at once).
// docs/idempotency.md says when to use which, and the windows that remain.
package idempotency
