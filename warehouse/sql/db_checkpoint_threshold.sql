-- How large the write-ahead log grows before DuckDB checkpoints. DuckDB binds no parameter in SET:
-- {{size}} is a size db.py matched whole against MEMORY_LIMIT (digits and a unit, "256MB") and
-- wrote as a string literal (warehouse/db.py, literal).
SET checkpoint_threshold = {{size}}
