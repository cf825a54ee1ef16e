-- DuckDB's worker threads ($count: at least 1).
SET threads = $count
