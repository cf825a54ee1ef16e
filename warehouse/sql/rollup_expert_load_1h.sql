-- Per-expert load of [$start, $until) rolled up into hours: tokens summed and snapshots counted per
-- target, layer and expert.
INSERT INTO expert_load_1h
SELECT time_bucket(INTERVAL 1 HOUR, ts), target, layer, expert, sum(tokens), count(*)
FROM expert_load WHERE ts >= $start AND ts < $until GROUP BY ALL
