-- DuckDB's buffer pool for the writer and every reader together ($size: "4GB", checked in
-- Warehouse.__init__ against MEMORY_LIMIT).
SET memory_limit = $size
