-- CPU overhead: per bucket, pool, target, engine and phase ('wall' for the step itself), the
-- seconds and the steps the plugin's step histograms counted.
WITH picked AS (
    SELECT series_id, role AS pool, target, engine, metric,
           coalesce(json_extract_string(labels, '$.phase'), 'wall') AS phase
    FROM series_targets
    WHERE role IN {{pools}}
      AND metric IN ('moemeter_step_phase_seconds_sum', 'moemeter_step_phase_seconds_count',
                     'moemeter_step_seconds_sum', 'moemeter_step_seconds_count')
),
/*increase*/
SELECT p.bucket, s.pool, s.target, s.engine, s.phase,
       sum(p.delta) FILTER (WHERE s.metric LIKE '%_sum') AS seconds,
       sum(p.delta) FILTER (WHERE s.metric LIKE '%_count') AS steps
FROM per_series p JOIN picked s USING (series_id)
GROUP BY ALL
