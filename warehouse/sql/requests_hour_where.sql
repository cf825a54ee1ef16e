-- The requests stored in [$ingested_from, $ingested_until) that finished in [$finished_from,
-- $finished_until); a NULL bound is open, and a NULL $ingested_from means "not rolled up yet"
-- (stored since the hourly roll-up's watermark).
ingested_at >= coalesce($ingested_from::TIMESTAMP,
                        (SELECT max(through) FROM rollup_state WHERE name = '1h'), '-infinity'::TIMESTAMP)
  AND ingested_at < coalesce($ingested_until::TIMESTAMP, 'infinity'::TIMESTAMP)
  AND finished_at >= coalesce($finished_from::TIMESTAMP, '-infinity'::TIMESTAMP)
  AND finished_at < coalesce($finished_until::TIMESTAMP, 'infinity'::TIMESTAMP)
