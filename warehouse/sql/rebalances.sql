-- One row per EPLB rebalance of $target in [$start, $end): duration, moved replicas, and the mean
-- planned-on balancedness before and planned (the worst layer's before too).
SELECT ts, any_value(duration_seconds) AS duration_seconds, any_value(moved_replicas) AS moved_replicas,
       avg(balancedness_before) AS planned_before, avg(balancedness_planned) AS planned_after,
       min(balancedness_before) AS worst_layer_before
FROM eplb_rebalances WHERE ts >= $start::TIMESTAMP AND ts < $end::TIMESTAMP AND target = $target
GROUP BY ts ORDER BY ts
