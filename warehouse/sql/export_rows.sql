-- The rows of {{table}}, a table that names no series, that the caller's condition keeps
-- (warehouse/export.py, named_by_key).
SELECT * FROM {{table}} WHERE /*where*/
