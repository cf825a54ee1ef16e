-- PoolAbsent: each pool's last scrape (answered or not) of any of its targets in [$start, $end).
SELECT t.role, max(x.ts) AS last_scraped
FROM scrapes x JOIN targets t ON t.name = x.target
WHERE x.ts >= $start::TIMESTAMP AND x.ts < $end::TIMESTAMP AND t.role IN {{pools}}
GROUP BY t.role
ORDER BY t.role
