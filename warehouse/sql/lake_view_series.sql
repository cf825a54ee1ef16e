-- the series of one rack as the view lake_view makes, each series' key its id (rows published before migration
-- 015 have no series_key): the columns quoted as identifiers and the rack a literal (DuckDB binds no parameter in a view)
CREATE VIEW main.{{table}} AS
SELECT {{"columns"}}
FROM (SELECT COLUMNS(lambda c: c <> 'series_key'), series_id AS series_key FROM lake.{{table}} WHERE rack = {{'rack'}})
