-- What DuckDB holds now, in bytes: in memory under its cap (cached blocks, the writer's and every
-- reader's working memory), and spilled to its temporary directory.
SELECT coalesce(sum(memory_usage_bytes), 0) AS held, coalesce(sum(temporary_storage_bytes), 0) AS spilled
FROM duckdb_memory()
