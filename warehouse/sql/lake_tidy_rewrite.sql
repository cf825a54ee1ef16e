-- tidy: rewrite the lake's data files that have deleted rows (the files rewritten)
SELECT count(*) FROM ducklake_rewrite_data_files('lake', delete_threshold => 0)
