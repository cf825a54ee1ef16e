-- Retention: the rows of {{table}} before $cutoff (a time the caller keeps at or before what is
-- rolled up); returns the rows deleted.
DELETE FROM {{table}} WHERE ts < $cutoff
