-- Autovacuum settings for Relay's hot tables.
--
-- A queue table is small and churns: every job is inserted, updated at claim
-- and at finish, and later deleted by retention. PostgreSQL's defaults start
-- a vacuum only when dead rows reach 20% of the table (+50), which for a
-- table of a few thousand live rows and thousands of jobs a second lets dead
-- index entries pile up in front of the claim's index scan between vacuums.
-- These per-table settings vacuum after 1% (+1000) dead rows, and let a
-- vacuum of these tables work with a larger cost budget so it keeps up.
-- (None of this helps while a long transaction holds back the xmin horizon:
-- docs/benchmarks.md measures that case, and the client warns at start when
-- autovacuum is off; see core/vacuum.go.)
ALTER TABLE relay_jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_limit = 2000,
    autovacuum_vacuum_cost_delay = 1
);

ALTER TABLE relay_outbox SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05
);

ALTER TABLE relay_idempotency_keys SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05
);

ALTER TABLE relay_schedule_fires SET (
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05
);
