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
/*increase*/,
parts AS (  -- each piece as what it adds to each figure (NULL: nothing)
    SELECT p.k,
           CASE WHEN s.metric = 'vllm:prompt_tokens_total' THEN p.delta END AS prompt,
           CASE WHEN s.source = 'local_cache_hit' THEN p.delta END AS cached,
           CASE WHEN s.metric = 'vllm:generation_tokens_total' THEN p.delta END AS generated,
           CASE WHEN s.metric = 'vllm:prompt_tokens_total' THEN p.idle_seconds * s.gpus END
               AS prefill_idle_gpu_seconds,
           CASE WHEN s.metric = 'vllm:generation_tokens_total' THEN p.idle_seconds * s.gpus END
               AS decode_idle_gpu_seconds,
           CASE WHEN s.metric = 'vllm:prompt_tokens_total' THEN (p.seconds - p.idle_seconds) * s.gpus END
               AS prefill_busy_gpu_seconds,
           CASE WHEN s.metric = 'vllm:generation_tokens_total' THEN (p.seconds - p.idle_seconds) * s.gpus END
               AS decode_busy_gpu_seconds
    FROM pieces p JOIN picked s USING (series_id)
)
-- Each figure summed exactly, to the billionth, in DECIMAL(38, 9): the order the threads add the
-- pieces in cannot move a cost by a bit, so the same rows (a rack's file, its copy in the lake) give
-- the same report. A piece past 1e15 (no scrape interval counts that many tokens: a broken
-- exporter's counter) is added as a double beside them (a DECIMAL(38, 9) sum wraps past 1.7e29,
-- beyond any sum of pieces under 1e15 that a window holds).
SELECT make_timestamp($origin_us + k * $step_us) AS bucket,
       coalesce(sum(CASE WHEN abs(COLUMNS(* EXCLUDE (k))) < 1e15 THEN COLUMNS(* EXCLUDE (k))::DECIMAL(38, 9) END)::DOUBLE, 0)
           + coalesce(sum(CASE WHEN NOT abs(COLUMNS(* EXCLUDE (k))) < 1e15 THEN COLUMNS(* EXCLUDE (k)) END), 0)
FROM parts
GROUP BY k ORDER BY k
