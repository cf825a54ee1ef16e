-- a sheet of the local warehouse, whole
SELECT * FROM {{table}}
