-- Live: the bucket increases of the vLLM histogram families in $families (sample names, `_bucket`),
-- summed over engines, per step and pool; pooled (warehouse/read.py): the minutes and hours come
-- from the pool rollups.
WITH picked AS (
    SELECT DISTINCT /*pool_key*/ AS series_id, metric, role, le FROM series_targets
    WHERE list_contains($families::VARCHAR[], metric) AND role IN {{pools}} AND le IS NOT NULL
),
/*pool_increase*/
SELECT s.metric, p.bucket, s.role, s.le, sum(p.delta) AS count
FROM per_series p JOIN picked s USING (series_id)
GROUP BY ALL ORDER BY metric, bucket, role, le
