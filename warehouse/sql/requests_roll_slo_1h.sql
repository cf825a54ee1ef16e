-- Adds the requests stored in [$ingested_from, $ingested_until) to their finishing hour's per-class
-- and tenant SLO sums; the line below is warehouse/sql/requests_slo.sql (warehouse/requests.py,
-- roll_requests_1h).
INSERT INTO requests_slo_1h
/*requests_slo*/
ON CONFLICT (ts, class, tenant) DO UPDATE SET
/*requests_slo_add*/
