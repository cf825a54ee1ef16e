-- Appends a batch of rows to {{table}}: the Arrow table registered as `_insert_batch`, its columns
-- in the table's order (warehouse/db.py, insert_arrow).
INSERT INTO {{table}} SELECT * FROM _insert_batch
