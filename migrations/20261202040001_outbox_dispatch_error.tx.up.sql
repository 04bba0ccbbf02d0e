-- An outbox event the dispatcher cannot read (headers that are not an
-- object of strings, written behind Publish) is set aside alone: it is
-- marked handled (dispatched_at, jobs 0) with failed_at and the decode error,
-- in the dispatch transaction that moves the events around it, so it is
-- never read again and no other event waits for it. An event dispatched in
-- spite of a part it could not read (a stored trace context of another
-- shape: it starts a new trace) keeps that error too, without failed_at.
-- Redispatching an event clears both.
ALTER TABLE relay_outbox ADD COLUMN failed_at timestamptz;
ALTER TABLE relay_outbox ADD COLUMN dispatch_error text;
