-- One chunk of the Parquet export: the rows of {{table}}, a table that names no series, whose time
-- column {{time}} (ts; finished_at for the request records) lies in [$from, $until), in time order
-- (warehouse/export.py).
SELECT * FROM {{table}} WHERE {{time}} >= $from::TIMESTAMP AND {{time}} < $until::TIMESTAMP ORDER BY {{time}}
