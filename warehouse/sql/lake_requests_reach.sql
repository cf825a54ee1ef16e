-- the earliest finish of the request records ingested in [$start, $end)
SELECT min(finished_at) FROM requests WHERE ingested_at >= $start AND ingested_at < $end
