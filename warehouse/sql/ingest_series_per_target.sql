-- How many series each target has: what the per-target series limit counts from after a restart.
SELECT target, count(*) AS series FROM series GROUP BY 1
