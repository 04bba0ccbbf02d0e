-- A backfilled fire (scheduler.Backfill): a past fire time fired on an
-- operator's request, under the fire's own key (schedule, fire_time), so
-- that a second backfill of it enqueues nothing. A fire skipped by the
-- overlap policy can be backfilled too: its row becomes 'backfilled'.
-- The new check is a superset of the old one: added NOT VALID (no scan
-- under the ALTER's lock), then validated (a scan that blocks no writer).
ALTER TABLE relay_schedule_fires DROP CONSTRAINT IF EXISTS relay_schedule_fires_outcome_check;
ALTER TABLE relay_schedule_fires ADD CONSTRAINT relay_schedule_fires_outcome_check
    CHECK (outcome IN ('enqueued', 'skipped_overlap', 'triggered', 'backfilled')) NOT VALID;
ALTER TABLE relay_schedule_fires VALIDATE CONSTRAINT relay_schedule_fires_outcome_check;
