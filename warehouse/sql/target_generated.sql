-- Experts: tokens $target generated per second, per step (vllm:generation_tokens_total, every
-- engine of the instance), to weigh a rebalance's pause against what it bought.
WITH picked AS (
    SELECT series_id FROM series WHERE target = $target AND metric = 'vllm:generation_tokens_total'
),
/*increase*/
SELECT p.bucket, sum(p.delta) / max(p.seconds) AS generated_per_s
FROM per_series p JOIN picked s USING (series_id)
WHERE p.seconds > 0
GROUP BY ALL ORDER BY bucket
