-- The latest expert placement stored for target $target (which expert each physical slot of each
-- layer holds): what a restarted writer compares a snapshot's with.
SELECT layer, slot, expert FROM expert_placement
WHERE target = $target AND ts = (SELECT max(ts) FROM expert_placement WHERE target = $target)
