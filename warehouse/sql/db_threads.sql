-- DuckDB's worker threads. DuckDB binds no parameter in SET: {{count}} is a Python int db.py
-- checked to be at least 1, written as its digits (warehouse/db.py, literal).
SET threads = {{count}}
