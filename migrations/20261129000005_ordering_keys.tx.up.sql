-- Ordering keys: jobs of one queue that share an ordering key run one at a
-- time, in id order. A job is not claimable while an earlier job with its
-- key is queued, claimed or dead (a dead job blocks its key until it is
-- requeued or cancelled).

ALTER TABLE relay_jobs ADD COLUMN ordering_key text
    CHECK (ordering_key IS NULL OR (ordering_key <> '' AND length(ordering_key) <= 500));

-- The claim's check, one probe per ordered candidate: the unfinished and
-- dead jobs of each key, in id order. Jobs without a key are not in it.
CREATE INDEX relay_jobs_ordering_idx ON relay_jobs (queue, ordering_key, id)
    WHERE ordering_key IS NOT NULL AND state IN ('queued', 'claimed', 'dead');
