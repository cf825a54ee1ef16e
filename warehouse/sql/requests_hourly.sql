-- CTEs `hourly` and `itl`: per hour in [$finished_from, $finished_until), the hourly tables' rows and
-- the same sums of the records not rolled up yet: every request that finished in those hours, once.
hourly AS (
    SELECT * FROM requests_1h WHERE ts >= $finished_from::TIMESTAMP AND ts < $finished_until::TIMESTAMP
    UNION ALL
    /*requests_hour_sums*/
),
itl AS (
    SELECT * FROM requests_itl_1h WHERE ts >= $finished_from::TIMESTAMP AND ts < $finished_until::TIMESTAMP
    UNION ALL
    /*requests_hour_itl*/
)
