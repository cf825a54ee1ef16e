-- Live: running and waiting requests (sum over engines) and KV-cache use (mean, max) per step and
-- pool, from the samples table that suits the step (/*samples*/, warehouse/read.py).
WITH per_ts AS (
    SELECT x.ts, s.role,
           sum(x.value) FILTER (WHERE s.metric = 'vllm:num_requests_running') AS running,
           sum(x.value) FILTER (WHERE s.metric = 'vllm:num_requests_waiting') AS waiting,
           avg(x.value) FILTER (WHERE s.metric = 'vllm:kv_cache_usage_perc') AS kv_mean,
           max(x.max) FILTER (WHERE s.metric = 'vllm:kv_cache_usage_perc') AS kv_max
    FROM /*samples*/ x JOIN series_targets s USING (series_id)
    WHERE x.ts >= $since::TIMESTAMP AND x.ts < $end::TIMESTAMP AND s.role IN ('prefill', 'decode')
      AND s.metric IN ('vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc')
    GROUP BY ALL
)
SELECT make_timestamp(epoch_us(ts) // $step_us * $step_us) AS bucket, role,
       avg(running) AS running, avg(waiting) AS waiting, avg(kv_mean) AS kv_mean, max(kv_max) AS kv_max
FROM per_ts GROUP BY ALL ORDER BY bucket, role
