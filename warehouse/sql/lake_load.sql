-- load an extension from its file (the path a literal: DuckDB binds no parameter in LOAD)
LOAD {{'extension'}}
