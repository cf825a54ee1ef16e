-- Where gateway $gateway's request feed was read up to (no row: never read).
SELECT log_id, seq, records, lost, rejected FROM request_feeds WHERE gateway = $gateway
