-- The targets scraped in [$start, $end): those in service then (a stack observed before, into the
-- same database, is not counted in this one's pools).
SELECT name, url, role, gpus, stack, hostname, last_seen FROM targets
WHERE name IN (SELECT DISTINCT target FROM scrapes WHERE ts >= $start::TIMESTAMP AND ts < $end::TIMESTAMP)
ORDER BY role, name
