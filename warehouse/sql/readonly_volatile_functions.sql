-- The scalar functions DuckDB marks VOLATILE: a reader's statement may call only the harmless ones
-- (warehouse/readonly.py, HARMLESS_VOLATILE).
SELECT DISTINCT function_name FROM duckdb_functions() WHERE stability = 'VOLATILE'
