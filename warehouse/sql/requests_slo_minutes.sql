-- Per finishing minute, SLO class and tenant, the sums requests_slo_1m and requests_slo_1h keep
-- (migration 012) of the requests `judged` picked (warehouse/sql/request_slo.sql).
SELECT time_bucket(INTERVAL 1 MINUTE, finished_at) AS ts, coalesce(slo_class, '') AS class, tenant,
/*requests_slo_counts*/
FROM judged
GROUP BY ALL
