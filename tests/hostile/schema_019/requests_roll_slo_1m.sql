-- Adds the requests stored in [$ingested_from, $ingested_until) to their finishing minute's
-- per-class SLO counts; the line below is warehouse/sql/requests_slo_minutes.sql
-- (warehouse/requests.py, roll_requests_slo_1m).
INSERT INTO requests_slo_1m
/*requests_slo_minutes*/
ON CONFLICT (ts, class) DO UPDATE SET held = held + excluded.held, met = met + excluded.met
