-- The alert pack's engine signals over the warehouse (warehouse/alerts.py judges them): each
-- prefill and decode engine's waiting queue and KV-cache use at each scrape in [$start, $end).
-- A round has one scrape time across targets, so the engines of a pool line up by ts.
SELECT x.ts, s.role, s.target, coalesce(s.engine, '0') AS engine,
       sum(x.value) FILTER (WHERE s.metric = 'vllm:num_requests_waiting') AS waiting,
       max(x.value) FILTER (WHERE s.metric = 'vllm:kv_cache_usage_perc') AS kv_usage
FROM samples x JOIN series_targets s USING (series_id)
WHERE x.ts >= $start::TIMESTAMP AND x.ts < $end::TIMESTAMP AND s.role IN ('prefill', 'decode')
  AND s.metric IN ('vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc')
GROUP BY ALL ORDER BY ts, role, target, engine
