-- Adds the requests stored in [$ingested_from, $ingested_until) to their finishing hour's
-- inter-token latency histogram (warehouse/requests.py, roll_requests_1h).
INSERT INTO requests_itl_1h
/*requests_hour_itl*/
ON CONFLICT (ts, bin) DO UPDATE SET requests = requests + excluded.requests
