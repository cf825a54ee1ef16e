-- a lake table's files in the current snapshot: data files, delete files, their bytes
SELECT count(*), count(delete_file), coalesce(sum(data_file_size_bytes + coalesce(delete_file_size_bytes, 0)), 0)
FROM ducklake_list_files('lake', $table)
