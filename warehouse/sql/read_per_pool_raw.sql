-- (a pooled statement's raw rows, warehouse/read.py) the members' raw increments, keyed by pool
(SELECT x.ts, k.pool AS series_id, x.delta, x.seconds FROM increments x JOIN members k USING (series_id))
