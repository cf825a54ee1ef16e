-- The CREATE statement of a table, in the connection's database or an attached one (warehouse/db.py,
-- computed_columns).
SELECT sql FROM duckdb_tables()
WHERE database_name = coalesce($database, current_database()) AND schema_name = 'main' AND table_name = $table
