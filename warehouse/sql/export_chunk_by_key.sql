-- One chunk of the Parquet export: the rows of {{table}}, a table whose rows name a series, of
-- [$from, $until), in time order, each series named by its key (as export_by_key.sql;
-- warehouse/export.py).
SELECT x.* REPLACE (s.series_key AS series_id)
FROM (SELECT * FROM {{table}} WHERE ts >= $from::TIMESTAMP AND ts < $until::TIMESTAMP) x JOIN series s USING (series_id)
ORDER BY ts
