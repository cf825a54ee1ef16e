-- What a round at $ts refused of the targets $targets (samples, records, snapshots), as recorded in
-- `rejected` (collectors/service.py).
SELECT coalesce(sum(count), 0) AS refused FROM rejected WHERE ts = $ts AND list_contains($targets, target)
