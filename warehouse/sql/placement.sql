-- The placement of $target in force at $end (the last one shown before it): layer, slot, rank and
-- the logical expert in each slot; one layer when $layer is given.
SELECT layer, slot, rank, expert FROM expert_placement
WHERE target = $target AND ($layer::INTEGER IS NULL OR layer = $layer::INTEGER)
  AND ts = (SELECT max(ts) FROM expert_placement WHERE target = $target AND ts < $end::TIMESTAMP)
ORDER BY layer, slot
