-- Each GPU's latest utilisation, power, memory and temperature (NULL where DCGM had none), from
-- each GPU exporter's last scrape that found it up, if that was at $since or later.
WITH last AS (SELECT target, max(ts) AS ts FROM scrapes WHERE up GROUP BY target)
SELECT s.target, s.hostname, json_extract_string(s.labels, '$.gpu')::INTEGER AS gpu,
       max(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_GPU_UTIL') AS util_pct,
       max(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_POWER_USAGE') AS power_watts,
       max(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_FB_USED') AS fb_used_mib,
       max(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_GPU_TEMP') AS temp_c,
       max(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_MEMORY_TEMP') AS memory_temp_c,
       max(x.ts) AS ts
FROM samples x JOIN series_targets s USING (series_id) JOIN last l ON l.target = s.target AND l.ts = x.ts
WHERE s.role = 'gpu' AND x.ts >= (SELECT min(ts) FROM last) AND x.ts >= $since::TIMESTAMP
GROUP BY ALL ORDER BY s.target, gpu
