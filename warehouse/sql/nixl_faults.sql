-- NIXL faults per target in ($start, $end]: failed transfers, failed notifications, requests whose
-- KV expired before decode read it (the increase of each counter; none listed when 0).
SELECT s.role, s.target, s.metric, sum(i.delta) AS increase, min(i.ts) FILTER (WHERE i.delta > 0) AS since
FROM increments i JOIN series_targets s USING (series_id)
WHERE i.ts > $start::TIMESTAMP AND i.ts <= $end::TIMESTAMP
  AND s.metric IN ('vllm:nixl_num_failed_transfers_total', 'vllm:nixl_num_failed_notifications_total',
                   'vllm:nixl_num_kv_expired_reqs_total')
GROUP BY ALL HAVING sum(i.delta) > 0 ORDER BY role, target, metric
