-- a table's columns and their types, in order, in a database of this connection ('lake' or 'memory')
SELECT column_name, data_type FROM duckdb_columns()
WHERE database_name = $database AND table_name = $table AND schema_name = 'main'
ORDER BY column_index
