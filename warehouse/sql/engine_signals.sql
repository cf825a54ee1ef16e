-- The alert pack's engine signals over the warehouse (warehouse/alerts.py judges them): each
-- prefill and decode engine at each scrape in [$start, $end): its waiting queue and KV-cache use,
-- and what its counters added since the scrape before: preemptions, the plugin's engine-step
-- seconds and steps, and the pool's tokens (POOL_TOKENS of warehouse/rules.py: the prefill pool's
-- computed prompt tokens, the decode pool's generated tokens), and vLLM's spec-decode drafts and
-- accepted tokens (NULL without a draft path). A round has one scrape time across
-- targets, so the engines of a pool line up by ts.
WITH picked AS (
    SELECT series_id, role, target, coalesce(engine, '0') AS engine, metric,
           json_extract_string(labels, '$.source') AS source
    FROM series_targets
    WHERE role IN {{pools}}
      AND metric IN ('vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc', 'vllm:num_preemptions_total',
                     'moemeter_step_seconds_sum', 'moemeter_step_seconds_count',
                     'vllm:prompt_tokens_by_source_total', 'vllm:generation_tokens_total',
                     'vllm:spec_decode_num_drafts_total', 'vllm:spec_decode_num_accepted_tokens_total')
),
gauges AS (
    SELECT x.ts, p.role, p.target, p.engine,
           sum(x.value) FILTER (WHERE p.metric = 'vllm:num_requests_waiting') AS waiting,
           max(x.value) FILTER (WHERE p.metric = 'vllm:kv_cache_usage_perc') AS kv_usage
    FROM samples x JOIN picked p USING (series_id)
    WHERE x.ts >= $start::TIMESTAMP AND x.ts < $end::TIMESTAMP
      AND p.metric IN ('vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc')
    GROUP BY ALL
),
counts AS (
    SELECT i.ts, p.role, p.target, p.engine,
           sum(i.delta) FILTER (WHERE p.metric = 'vllm:num_preemptions_total') AS preemptions,
           sum(i.delta) FILTER (WHERE p.metric = 'moemeter_step_seconds_sum') AS step_seconds,
           sum(i.delta) FILTER (WHERE p.metric = 'moemeter_step_seconds_count') AS steps,
           sum(i.delta) FILTER (WHERE p.role = 'prefill' AND p.metric = 'vllm:prompt_tokens_by_source_total'
                                      AND p.source = 'local_compute'
                                   OR p.role = 'decode' AND p.metric = 'vllm:generation_tokens_total') AS tokens,
           sum(i.delta) FILTER (WHERE p.metric = 'vllm:spec_decode_num_drafts_total') AS drafts,
           sum(i.delta) FILTER (WHERE p.metric = 'vllm:spec_decode_num_accepted_tokens_total') AS accepted
    FROM increments i JOIN picked p USING (series_id)
    WHERE i.ts >= $start::TIMESTAMP AND i.ts < $end::TIMESTAMP
      AND p.metric NOT IN ('vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc')
    GROUP BY ALL
)
SELECT * FROM gauges FULL JOIN counts USING (ts, role, target, engine) ORDER BY ts, role, target, engine
