-- Retention of the request records: those stored before $cutoff (by when they were stored, which
-- is what the hourly roll-up follows); returns the rows deleted.
DELETE FROM requests WHERE ingested_at < $cutoff
