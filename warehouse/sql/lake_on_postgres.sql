-- whether this connection has the lake's PostgreSQL catalog attached plainly (LOCK_DB)
SELECT count(*) FROM duckdb_databases() WHERE database_name = $database
