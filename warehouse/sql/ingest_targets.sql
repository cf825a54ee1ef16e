-- Stores the round's new or changed targets (the Arrow batch `_insert_batch`, in the table's column
-- order): a known target's url, role, GPUs, stack and host are replaced, its first_seen kept
-- (warehouse/ingest.py).
INSERT INTO targets SELECT * FROM _insert_batch
ON CONFLICT (name) DO UPDATE SET url = excluded.url, role = excluded.role, gpus = excluded.gpus,
    stack = excluded.stack, hostname = excluded.hostname, last_seen = excluded.last_seen
