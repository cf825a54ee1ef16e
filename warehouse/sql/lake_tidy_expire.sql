-- tidy: expire the snapshots older than $keep seconds (the snapshots expired)
SELECT count(*) FROM ducklake_expire_snapshots('lake', older_than => now() - to_seconds($keep))
