-- tidy: remove the files no snapshot reads any more, once $keep seconds old (the files removed)
SELECT count(*) FROM ducklake_cleanup_old_files('lake', older_than => now() - to_seconds($keep))
