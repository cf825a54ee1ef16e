-- The rows of {{table}}, a table whose rows name a series by its series_id (a number of this file,
-- migration 015), that the caller's condition keeps, each series named by its key instead
-- (warehouse/export.py, named_by_key).
SELECT x.* REPLACE (s.series_key AS series_id)
FROM (SELECT * FROM {{table}} WHERE /*where*/) x JOIN series s USING (series_id)
