-- Speculative decoding: per step, pool, instance and engine of every target that exports vLLM's
-- spec-decode counters, the drafts, draft tokens, accepted tokens (also per draft position) it
-- counted, and the generated tokens of every decode target, drafting or not, so that a pool's
-- rejected share is of all its decode compute (docs/definitions.md, Speculative decoding). Long form: one row per
-- counter and position. A per-position series whose label is not a whole number in
-- [0, $positions) is left out (the other counters keep their rows).
WITH drafting AS (
    SELECT DISTINCT target FROM series WHERE metric = 'vllm:spec_decode_num_drafts_total'
),
picked AS (
    SELECT series_id, role, target, coalesce(engine, '0') AS engine, metric,
           try_cast(json_extract_string(labels, '$.position') AS INTEGER) AS position
    FROM series_targets
    WHERE (target IN (SELECT target FROM drafting) OR role = 'decode' AND metric = 'vllm:generation_tokens_total')
      AND metric IN ('vllm:spec_decode_num_drafts_total', 'vllm:spec_decode_num_draft_tokens_total',
                     'vllm:spec_decode_num_accepted_tokens_total',
                     'vllm:spec_decode_num_accepted_tokens_per_pos_total', 'vllm:generation_tokens_total')
      AND (metric <> 'vllm:spec_decode_num_accepted_tokens_per_pos_total'
           OR try_cast(json_extract_string(labels, '$.position') AS INTEGER) BETWEEN 0 AND $positions - 1)
),
/*increase*/
SELECT p.bucket, s.role, s.target, s.engine, s.metric, s.position, sum(p.delta) AS delta, max(p.seconds) AS seconds
FROM per_series p JOIN picked s USING (series_id)
GROUP BY ALL
