-- Every scrape in [$start, $end): when, whom (and its role), and whether it answered (target-down,
-- pool-absent and pool-idle alerts).
SELECT x.ts, x.target, t.role, x.up
FROM scrapes x LEFT JOIN targets t ON t.name = x.target
WHERE x.ts >= $start::TIMESTAMP AND x.ts < $end::TIMESTAMP ORDER BY x.target, x.ts
