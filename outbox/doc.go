// Package outbox will hold the transactional outbox: events published inside
// business transactions, subscriptions mapping topics to job kinds, and a
// dispatcher that turns each event into its subscribers' jobs exactly once,
// in order per key.
//
// Not built yet.
package outbox
