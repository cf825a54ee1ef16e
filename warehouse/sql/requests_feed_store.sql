-- Stores where gateway $gateway's request feed was read up to, with the records it stored (in the
-- same transaction: the cursor moves with the records).
INSERT INTO request_feeds (gateway, log_id, seq, records, lost, rejected, updated_at)
VALUES ($gateway, $log_id, $seq, $records, $lost, $rejected, $updated_at)
ON CONFLICT (gateway) DO UPDATE SET log_id = excluded.log_id, seq = excluded.seq, records = excluded.records,
    lost = excluded.lost, rejected = excluded.rejected, updated_at = excluded.updated_at
