-- The rows of {{table}}, a table that names no series, that the /*where*/ condition keeps
-- (warehouse/export.py, named_by_key).
SELECT * FROM {{table}} WHERE /*where*/
