-- GPUs in service at each scrape of [$start, $end): the GPUs of the pools' targets ($targets, with
-- $gpus each) whose scrape found them up (warehouse/cost.py, daily_statement: one read, split by day).
SELECT ts, sum(CASE WHEN up THEN g.gpus ELSE 0 END) AS gpus
FROM scrapes JOIN (SELECT unnest($targets) AS target, unnest($gpus) AS gpus) g USING (target)
WHERE ts >= $start AND ts < $end GROUP BY ts
