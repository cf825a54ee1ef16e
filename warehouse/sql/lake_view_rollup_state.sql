-- one rack's watermarks as the warehouse's rollup_state: no raw rows in the lake, those before the published
-- minute were 'dropped' (the rack a literal: DuckDB binds no parameter in a view)
CREATE VIEW main.rollup_state AS
SELECT name, through FROM lake.{{state}} WHERE rack = {{'rack'}}
UNION ALL
SELECT 'increments_from', through FROM lake.{{state}} WHERE rack = {{'rack'}} AND name = '1m'
