-- (a pooled statement's rollup rows, warehouse/read.py) the pool rollup {{table}}'s rows of the
-- picked pools' sample names: a join on the name first, then on the whole key
(SELECT ts, /*pool_key*/ AS series_id, delta, seconds, idle_seconds FROM {{table}}
 WHERE metric IN (SELECT series_id.metric FROM picked))
