-- Roofline: the GPU models the GPU exporters scraped in [$start, $end) report (dcgm-exporter's
-- modelName label): per exporter, the host it names and its GPUs of each model, so a pool's targets
-- on those hosts are measured against their own GPU's roofs.
SELECT s.target, coalesce(json_extract_string(s.labels, '$.Hostname'), s.hostname) AS host,
       json_extract_string(s.labels, '$.modelName') AS gpu_model,
       count(DISTINCT json_extract_string(s.labels, '$.gpu')) AS gpus
FROM series_targets s
WHERE s.role = 'gpu' AND json_extract_string(s.labels, '$.modelName') IS NOT NULL
  AND s.target IN (SELECT DISTINCT target FROM scrapes WHERE ts >= $start::TIMESTAMP AND ts < $end::TIMESTAMP)
GROUP BY ALL
ORDER BY s.target, gpu_model
