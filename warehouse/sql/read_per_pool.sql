-- (a pooled statement's rollup rows in a file without pool rollups, warehouse/read.py) the members'
-- rows of the per-series rollup {{table}}, keyed by pool: the same numbers read the slow way
(SELECT x.ts, k.pool AS series_id, x.delta, x.seconds, x.idle_seconds FROM {{table}} x JOIN members k USING (series_id))
