-- How large the write-ahead log grows before DuckDB checkpoints ($size: "256MB").
SET checkpoint_threshold = $size
