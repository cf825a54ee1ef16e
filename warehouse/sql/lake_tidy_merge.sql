-- tidy: merge the small files of a table and rack into files of up to $bytes (the files merged)
SELECT count(*) FROM ducklake_merge_adjacent_files('lake', max_file_size => $bytes)
