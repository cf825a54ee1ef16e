-- a column a later migration gave the warehouse's table, added to the lake's: its name quoted as an identifier
-- and its type as duckdb_columns() writes it (DuckDB binds no parameter in DDL)
ALTER TABLE lake.{{table}} ADD COLUMN {{"column"}} {{:type}}
