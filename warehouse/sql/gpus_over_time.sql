-- Mean GPU utilisation and total rack power per step, from the samples table that suits the step.
SELECT make_timestamp(epoch_us(x.ts) // $step_us * $step_us) AS bucket,
       avg(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_GPU_UTIL') AS util_pct,
       sum(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_POWER_USAGE') / count(DISTINCT x.ts) AS power_watts
FROM /*samples*/ x JOIN series_targets s USING (series_id)
WHERE x.ts >= $since::TIMESTAMP AND x.ts < $end::TIMESTAMP AND s.role = 'gpu'
  AND s.metric IN ('DCGM_FI_DEV_GPU_UTIL', 'DCGM_FI_DEV_POWER_USAGE')
GROUP BY ALL ORDER BY bucket
