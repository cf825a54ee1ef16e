-- Clears the longest interval before ingest_longest_set.sql stores a longer one (one row, never
-- more).
DELETE FROM longest_interval
