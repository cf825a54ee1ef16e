-- Live: the bucket increases of the vLLM histogram families in $families (sample names, `_bucket`),
-- summed over engines, per step and pool.
WITH picked AS (
    SELECT series_id, metric, role, le FROM series_targets
    WHERE list_contains($families::VARCHAR[], metric) AND role IN ('prefill', 'decode')
),
/*increase*/
SELECT s.metric, p.bucket, s.role, s.le, sum(p.delta) AS count
FROM per_series p JOIN picked s USING (series_id)
GROUP BY ALL ORDER BY metric, bucket, role, le
