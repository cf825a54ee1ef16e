-- attach the lake (its catalog, 'ducklake:...', a literal: DuckDB binds no parameter in ATTACH's path)
ATTACH {{'catalog'}} AS lake (READ_ONLY $read_only)
