// Package outbox is a transactional outbox: business code publishes events
// ("payment.succeeded for order 42") in the same transaction as its own
// writes, and a dispatcher turns each committed event into one job per
// subscriber.
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if err := saveOrder(ctx, tx, order); err != nil {
//			return err
//		}
//		_, err := outbox.Publish(ctx, tx, outbox.Event{Topic: "payment.succeeded", Key: order.ID, Payload: order})
//		return err
//	})
//
// A rollback leaves no event. The dispatcher marks an event dispatched and
// enqueues its jobs in one transaction, so each subscriber gets each event
// exactly once, whatever crashes. Events with the same key reach each
// subscriber in publish order, one at a time (core ordering keys); other
// keys run in parallel. Subscriptions are declared in code and stored in
// the database, owned by a namespace, so every dispatcher fans out to the
// same set during a rolling deploy; the publisher's trace context travels
// with each event to its jobs; webhooks are signed per Standard Webhooks.
// docs/outbox.md has the guarantees.
package outbox
