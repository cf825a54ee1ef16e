-- A rack's requests_itl_1h rows of the hours [$finished_from, $finished_until) as its own file sums
-- them (requests_hourly.sql): the table's rows and the same histogram of the records stored since the
-- hourly roll-up's watermark and before $ingested_until, as lake_requests_1h.sql.
SELECT ts, bin, sum(requests)::BIGINT AS requests
FROM (SELECT * FROM requests_itl_1h WHERE ts >= $finished_from::TIMESTAMP AND ts < $finished_until::TIMESTAMP
      UNION ALL BY NAME
      /*requests_hour_itl*/)
GROUP BY ts, bin
