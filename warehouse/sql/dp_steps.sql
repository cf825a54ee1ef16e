-- DP ranks: each engine of pool $role, per step: the tokens and engine steps vLLM's
-- iteration-tokens histogram counted, and the seconds and steps the plugin's step histogram timed.
WITH picked AS (
    SELECT series_id, target, coalesce(engine, '0') AS engine, metric
    FROM series_targets
    WHERE role = $role
      AND metric IN ('vllm:iteration_tokens_total_sum', 'vllm:iteration_tokens_total_count',
                     'moemeter_step_seconds_sum', 'moemeter_step_seconds_count')
),
/*increase*/
SELECT p.bucket, s.target, s.engine,
       sum(p.delta) FILTER (WHERE s.metric = 'vllm:iteration_tokens_total_sum') AS tokens,
       sum(p.delta) FILTER (WHERE s.metric = 'vllm:iteration_tokens_total_count') AS steps,
       sum(p.delta) FILTER (WHERE s.metric = 'moemeter_step_seconds_sum') AS step_seconds,
       sum(p.delta) FILTER (WHERE s.metric = 'moemeter_step_seconds_count') AS timed_steps
FROM per_series p JOIN picked s USING (series_id)
GROUP BY ALL
