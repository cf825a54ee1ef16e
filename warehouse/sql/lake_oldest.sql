-- the oldest row of a local table a rack publishes
SELECT min(ts) FROM {{table}}
