-- tidy: remove the files no commit ever named (a writer killed mid-step), once $keep seconds old
SELECT count(*) FROM ducklake_delete_orphaned_files('lake', older_than => now() - to_seconds($keep))
