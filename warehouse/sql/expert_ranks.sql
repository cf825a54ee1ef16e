-- Experts: tokens each EP rank's slots of $target received, per step and MoE layer (the plugin's
-- moemeter_expert_rank_tokens_total; its engine label is the rank).
WITH picked AS (
    SELECT series_id, json_extract_string(labels, '$.layer')::INTEGER AS layer, engine::INTEGER AS rank
    FROM series WHERE target = $target AND metric = 'moemeter_expert_rank_tokens_total'
),
/*increase*/
SELECT p.bucket, s.layer, s.rank, sum(p.delta) AS tokens
FROM per_series p JOIN picked s USING (series_id)
GROUP BY ALL  -- in no order: its readers group the rows (a day's 310,000 sorted: 0.03 s)
