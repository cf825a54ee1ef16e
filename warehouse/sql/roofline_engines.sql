-- Roofline: each engine of the prefill and decode pools, per step: vLLM's estimated FLOPs and bytes
-- read and written per GPU (vllm/v1/metrics/perf.py) and the seconds its FLOPs counter covered; its
-- generated tokens and, where it speculates, its draft and accepted tokens, and the share of its
-- decode compute the rejected drafts took: (draft - accepted) / (generated + draft - accepted), NULL
-- where the engine exports no speculative-decoding counters (docs/definitions.md, Roofline).
WITH picked AS (
    SELECT series_id, role, target, gpus, coalesce(engine, '0') AS engine, metric,
           json_extract_string(labels, '$.model_name') AS model_name
    FROM series_targets
    WHERE role IN {{pools}}
      AND metric IN ('vllm:estimated_flops_per_gpu_total', 'vllm:estimated_read_bytes_per_gpu_total',
                     'vllm:estimated_write_bytes_per_gpu_total', 'vllm:generation_tokens_total',
                     'vllm:spec_decode_num_draft_tokens_total', 'vllm:spec_decode_num_accepted_tokens_total')
),
/*increase*/
, engines AS (
    SELECT p.bucket, s.role, s.target, s.engine, max(s.gpus) AS target_gpus, max(s.model_name) AS model_name,
           sum(p.delta) FILTER (WHERE s.metric = 'vllm:estimated_flops_per_gpu_total') AS flops,
           sum(p.delta) FILTER (WHERE s.metric = 'vllm:estimated_read_bytes_per_gpu_total') AS read_bytes,
           sum(p.delta) FILTER (WHERE s.metric = 'vllm:estimated_write_bytes_per_gpu_total') AS write_bytes,
           sum(p.seconds) FILTER (WHERE s.metric = 'vllm:estimated_flops_per_gpu_total') AS seconds,
           sum(p.delta) FILTER (WHERE s.metric = 'vllm:generation_tokens_total') AS generated,
           sum(p.delta) FILTER (WHERE s.metric = 'vllm:spec_decode_num_draft_tokens_total') AS draft_tokens,
           sum(p.delta) FILTER (WHERE s.metric = 'vllm:spec_decode_num_accepted_tokens_total') AS accepted_tokens
    FROM per_series p JOIN picked s USING (series_id)
    GROUP BY ALL
)
SELECT *, rejected / nullif(generated + rejected, 0) AS rejected_share
FROM (SELECT *,  -- clipped at 0 (a broken exporter's accepted over drafted), NULL where nothing drafts
             CASE WHEN draft_tokens < accepted_tokens THEN 0 ELSE draft_tokens - accepted_tokens END AS rejected
      FROM engines)
ORDER BY bucket, role, target, engine
