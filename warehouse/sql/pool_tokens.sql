-- Per bucket of the window: the prefill pool's prompt and cached prompt tokens, the decode pool's
-- generated tokens (docs/definitions.md, Tokens), and each pool's idle and busy GPU-seconds: per
-- engine, its GPUs x the seconds of the scrape intervals in which its token counter did not move,
-- and did. $targets, $roles and $gpus list the pools' targets (role prefill or decode) and the GPUs
-- each holds.
WITH picked AS (
    SELECT s.series_id, s.metric, g.role, json_extract_string(s.labels, '$.source') AS source,
           g.gpus / count(*) OVER (PARTITION BY s.target, s.metric) AS gpus
    FROM series s
    JOIN (SELECT unnest($targets::VARCHAR[]) AS target, unnest($roles::VARCHAR[]) AS role,
                 unnest($gpus::DOUBLE[]) AS gpus) g USING (target)
    WHERE g.role = 'prefill' AND s.metric IN ('vllm:prompt_tokens_total', 'vllm:prompt_tokens_by_source_total')
       OR g.role = 'decode' AND s.metric = 'vllm:generation_tokens_total'
),
/*increase*/
SELECT p.bucket,
       coalesce(sum(p.delta) FILTER (WHERE s.metric = 'vllm:prompt_tokens_total'), 0) AS prompt,
       coalesce(sum(p.delta) FILTER (WHERE s.source = 'local_cache_hit'), 0) AS cached,
       coalesce(sum(p.delta) FILTER (WHERE s.metric = 'vllm:generation_tokens_total'), 0) AS generated,
       coalesce(sum(p.idle_seconds * s.gpus) FILTER (WHERE s.metric = 'vllm:prompt_tokens_total'), 0)
           AS prefill_idle_gpu_seconds,
       coalesce(sum(p.idle_seconds * s.gpus) FILTER (WHERE s.metric = 'vllm:generation_tokens_total'), 0)
           AS decode_idle_gpu_seconds,
       coalesce(sum((p.seconds - p.idle_seconds) * s.gpus) FILTER (WHERE s.metric = 'vllm:prompt_tokens_total'), 0)
           AS prefill_busy_gpu_seconds,
       coalesce(sum((p.seconds - p.idle_seconds) * s.gpus) FILTER (WHERE s.metric = 'vllm:generation_tokens_total'), 0)
           AS decode_busy_gpu_seconds
FROM per_series p JOIN picked s USING (series_id)
GROUP BY p.bucket ORDER BY p.bucket
