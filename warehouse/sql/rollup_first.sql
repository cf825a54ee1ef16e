-- The oldest data the warehouse holds, of any kind: where rolling starts in a database without
-- roll-up marks (a file may hold request records alone).
SELECT least((SELECT min(ts) FROM samples), (SELECT min(ts) FROM expert_load),
             (SELECT min(ingested_at) FROM requests)) AS first
