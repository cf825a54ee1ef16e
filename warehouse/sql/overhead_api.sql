-- CPU overhead: per bucket, the prefill pool's increases of vLLM's request-time histograms' sums
-- and counts, and of the plugin's API-output histogram; pooled (warehouse/read.py).
WITH picked AS (
    SELECT DISTINCT /*pool_key*/ AS series_id, role AS pool, metric FROM series_targets
    WHERE role = 'prefill'
      AND metric IN ('vllm:time_to_first_token_seconds_sum', 'vllm:time_to_first_token_seconds_count',
                     'vllm:request_queue_time_seconds_sum', 'vllm:request_queue_time_seconds_count',
                     'vllm:request_prefill_time_seconds_sum', 'vllm:request_prefill_time_seconds_count',
                     'moemeter_api_output_seconds_sum', 'moemeter_api_output_seconds_count')
),
/*pool_increase*/
SELECT p.bucket, s.pool, s.metric, sum(p.delta) AS delta
FROM per_series p JOIN picked s USING (series_id)
GROUP BY ALL
