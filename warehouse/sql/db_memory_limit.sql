-- DuckDB's buffer pool for the writer and every reader together. DuckDB binds no parameter in SET:
-- {{size}} is a size db.py matched whole against MEMORY_LIMIT (digits and a unit, "4GB") and wrote
-- as a string literal (warehouse/db.py, literal).
SET memory_limit = {{size}}
