-- DP ranks: each engine of pool $role, per step: its running and waiting requests (summed over the
-- engine's series at a scrape, then averaged over the step's scrapes) and its KV-cache use, from
-- the samples table that suits the step (/*samples*/, warehouse/read.py).
WITH per_ts AS (
    SELECT x.ts, s.target, coalesce(s.engine, '0') AS engine,
           sum(x.value) FILTER (WHERE s.metric = 'vllm:num_requests_running') AS running,
           sum(x.value) FILTER (WHERE s.metric = 'vllm:num_requests_waiting') AS waiting,
           max(x.value) FILTER (WHERE s.metric = 'vllm:kv_cache_usage_perc') AS kv_usage
    FROM /*samples*/ x JOIN series_targets s USING (series_id)
    WHERE x.ts >= $since::TIMESTAMP AND x.ts < $end::TIMESTAMP AND s.role = $role
      AND s.metric IN ('vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc')
    GROUP BY ALL
)
SELECT make_timestamp(epoch_us(ts) // $step_us * $step_us) AS bucket, target, engine,
       avg(running) AS running, avg(waiting) AS waiting, avg(kv_usage) AS kv_usage
FROM per_ts GROUP BY ALL ORDER BY bucket, target, engine
