-- Adds the requests stored in [$ingested_from, $ingested_until) to their finishing minute's SLO
-- sums per class and tenant (warehouse/requests.py, roll_requests_slo_1m).
INSERT INTO requests_slo_1m
WITH /*request_slo*/
/*requests_slo_minutes*/
ON CONFLICT (ts, class, tenant) DO UPDATE SET
/*requests_slo_add*/
