-- Opens the read-only transaction a reader's statement runs in, always rolled back after it: DuckDB
-- refuses any write inside it (warehouse/readonly.py, guard 1).
BEGIN TRANSACTION READ ONLY
