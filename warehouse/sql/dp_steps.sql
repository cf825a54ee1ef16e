-- DP ranks: each engine of pool $role, per step: the tokens and engine steps vLLM's
-- iteration-tokens histogram counted, the seconds and steps the plugin's step histogram timed, and
-- its NIXL KV transfers: their count and seconds, those that failed, and the requests whose KV
-- expired before decode read it.
WITH picked AS (
    SELECT series_id, target, coalesce(engine, '0') AS engine, metric
    FROM series_targets
    WHERE role = $role
      AND metric IN ('vllm:iteration_tokens_total_sum', 'vllm:iteration_tokens_total_count',
                     'moemeter_step_seconds_sum', 'moemeter_step_seconds_count',
                     'vllm:nixl_xfer_time_seconds_sum', 'vllm:nixl_xfer_time_seconds_count',
                     'vllm:nixl_num_failed_transfers_total', 'vllm:nixl_num_kv_expired_reqs_total')
),
/*increase*/
SELECT p.bucket, s.target, s.engine,
       sum(p.delta) FILTER (WHERE s.metric = 'vllm:iteration_tokens_total_sum') AS tokens,
       sum(p.delta) FILTER (WHERE s.metric = 'vllm:iteration_tokens_total_count') AS steps,
       sum(p.delta) FILTER (WHERE s.metric = 'moemeter_step_seconds_sum') AS step_seconds,
       sum(p.delta) FILTER (WHERE s.metric = 'moemeter_step_seconds_count') AS timed_steps,
       sum(p.delta) FILTER (WHERE s.metric = 'vllm:nixl_xfer_time_seconds_sum') AS xfer_seconds,
       sum(p.delta) FILTER (WHERE s.metric = 'vllm:nixl_xfer_time_seconds_count') AS transfers,
       sum(p.delta) FILTER (WHERE s.metric = 'vllm:nixl_num_failed_transfers_total') AS failed_transfers,
       sum(p.delta) FILTER (WHERE s.metric = 'vllm:nixl_num_kv_expired_reqs_total') AS expired_kv
FROM per_series p JOIN picked s USING (series_id)
GROUP BY ALL
