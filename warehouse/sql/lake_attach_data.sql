-- attach the lake, its Parquet files under $data_path (its catalog, 'ducklake:...', a literal: DuckDB binds no
-- parameter in ATTACH's path)
ATTACH {{'catalog'}} AS lake (DATA_PATH $data_path, READ_ONLY $read_only)
