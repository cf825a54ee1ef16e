-- Live: per bucket and pool, prompt, cached prompt and generated tokens per second. Each target's
-- rate is its increase over the seconds its counters covered in the bucket; a pool's the sum.
WITH picked AS (
    SELECT series_id, target, role, metric, json_extract_string(labels, '$.source') AS source
    FROM series_targets
    WHERE role IN {{pools}}
      AND metric IN ('vllm:prompt_tokens_total', 'vllm:prompt_tokens_by_source_total', 'vllm:generation_tokens_total')
),
/*increase*/
, per_target AS (
    SELECT p.bucket, s.target, s.role,
           sum(p.delta) FILTER (WHERE s.metric = 'vllm:prompt_tokens_total') AS prompt,
           sum(p.delta) FILTER (WHERE s.metric = 'vllm:prompt_tokens_by_source_total' AND s.source = 'local_cache_hit') AS cached,
           sum(p.delta) FILTER (WHERE s.metric = 'vllm:generation_tokens_total') AS generated,
           max(p.seconds) AS seconds
    FROM per_series p JOIN picked s USING (series_id) GROUP BY ALL
)
SELECT bucket, role,
       sum(coalesce(prompt, 0) / seconds) AS prompt_per_s,
       sum(coalesce(cached, 0) / seconds) AS cached_per_s,
       sum(coalesce(generated, 0) / seconds) AS generated_per_s
FROM per_target WHERE seconds > 0 GROUP BY ALL ORDER BY bucket, role
