-- Counter increases of the series in `picked` over the window [$start, $end), per bucket of
-- $step_us microseconds from $origin_us (docs/definitions.md, Windows). The CTE list goes after
-- the caller's `picked` (series_id, ...) and defines `pieces` (k, series_id, delta, seconds,
-- idle_seconds: what each row gives the k-th bucket) and `per_series` (bucket, series_id, delta,
-- seconds, idle_seconds: their sums). A sum of doubles depends on the order it adds them in,
-- which threads and the files' layout decide: a figure that must come out the same to the bit
-- (a cost, a FOCUS row) sums `pieces` exactly (pool_tokens.sql), over the same rows in a rack's file
-- and in the lake (warehouse/read.py, increases: sixes=False).
--
-- A raw increment stored at ts with interval `seconds` covers (ts - seconds, ts]; a rollup row
-- covers its minute or hour. A piece of the window takes the share of each row's span that lies
-- inside it, so a window ending on a scrape keeps the interval closing there and consecutive
-- windows partition every counter. Who serves which piece (warehouse/read.py chooses):
--   raw rows, all of them:            [$start, $r0) and [$r1, $end)
--   minute rows:                      [$r0, $s0) and [$s1, $r1)
--   six-minute rows:                  [$s0, $h0) and [$h1, $s1)
--   hour rows:                        [$h0, $h1)
--   raw rows not rolled up yet
--   (ts >= $through), over:           [$r0, $r1)
-- The minute, six-minute and hour tables hold exactly the raw rows before $through, split by
-- minute, six minutes and hour, so the pieces add up to the raw rows and nothing is counted twice.
-- The four sources below are those tables, or, in a pooled statement, their rows summed per pool
-- (warehouse/read.py; /*members*/ is where it names the pools' member series, when it reads
-- per-series tables).
/*members*/
src AS (
    -- Raw rows of each raw piece [a, b): an interval touches it when ts > a and ts - seconds < b, so
    -- ts < b + $reach_us (the longest interval stored) bounds each scan of the raw table.
    SELECT i.series_id, epoch_us(i.ts) - round(i.seconds * 1e6)::BIGINT AS lo, epoch_us(i.ts) AS hi, i.delta,
           i.seconds AS covered, CASE WHEN i.delta = 0 THEN i.seconds ELSE 0.0 END AS idle,
           epoch_us($start::TIMESTAMP) AS a, epoch_us($r0::TIMESTAMP) AS b
    FROM /*raw*/ i
    WHERE i.ts > $start::TIMESTAMP AND i.ts < make_timestamp(epoch_us($r0::TIMESTAMP) + $reach_us)
      AND i.series_id IN (SELECT series_id FROM picked)
    UNION ALL
    SELECT i.series_id, epoch_us(i.ts) - round(i.seconds * 1e6)::BIGINT AS lo, epoch_us(i.ts) AS hi, i.delta,
           i.seconds AS covered, CASE WHEN i.delta = 0 THEN i.seconds ELSE 0.0 END AS idle,
           epoch_us($r1::TIMESTAMP), epoch_us($end::TIMESTAMP)
    FROM /*raw*/ i
    WHERE i.ts > $r1::TIMESTAMP AND i.ts < make_timestamp(epoch_us($end::TIMESTAMP) + $reach_us)
      AND i.series_id IN (SELECT series_id FROM picked)
    UNION ALL
    -- raw rows not rolled up yet, over the pieces the rollups serve
    SELECT i.series_id, epoch_us(i.ts) - round(i.seconds * 1e6)::BIGINT AS lo, epoch_us(i.ts) AS hi, i.delta,
           i.seconds AS covered, CASE WHEN i.delta = 0 THEN i.seconds ELSE 0.0 END AS idle,
           epoch_us($r0::TIMESTAMP), epoch_us($r1::TIMESTAMP)
    FROM /*raw*/ i
    WHERE i.ts > $r0::TIMESTAMP AND i.ts >= $through::TIMESTAMP
      AND i.ts < make_timestamp(epoch_us($r1::TIMESTAMP) + $reach_us)
      AND i.series_id IN (SELECT series_id FROM picked)
    UNION ALL
    -- minute rows of each minute piece [a, b), each piece its own scan (one scan of [$r0, $r1)
    -- would read every minute of a week to keep the two hours at its edges)
    SELECT m.series_id, epoch_us(m.ts), epoch_us(m.ts) + 60000000, m.delta, m.seconds, m.idle_seconds,
           epoch_us($r0::TIMESTAMP), epoch_us($s0::TIMESTAMP)
    FROM /*minutes*/ m
    WHERE NOT $whole_minutes AND m.ts > $r0::TIMESTAMP - INTERVAL 1 MINUTE AND m.ts < $s0::TIMESTAMP
      AND m.series_id IN (SELECT series_id FROM picked)
    UNION ALL
    SELECT m.series_id, epoch_us(m.ts), epoch_us(m.ts) + 60000000, m.delta, m.seconds, m.idle_seconds,
           epoch_us($s1::TIMESTAMP), epoch_us($r1::TIMESTAMP)
    FROM /*minutes*/ m
    WHERE NOT $whole_minutes AND m.ts > $s1::TIMESTAMP - INTERVAL 1 MINUTE AND m.ts < $r1::TIMESTAMP
      AND m.series_id IN (SELECT series_id FROM picked)
    UNION ALL
    SELECT h.series_id, epoch_us(h.ts), epoch_us(h.ts) + 3600000000, h.delta, h.seconds, h.idle_seconds,
           epoch_us($h0::TIMESTAMP), epoch_us($h1::TIMESTAMP)
    FROM /*hours*/ h
    WHERE NOT $whole_hours AND h.ts > $h0::TIMESTAMP - INTERVAL 1 HOUR AND h.ts < $h1::TIMESTAMP
      AND h.series_id IN (SELECT series_id FROM picked)
),
whole AS (
    -- where every rollup row lies inside its piece and inside one bucket ($whole_minutes,
    -- $whole_hours: the pieces' edges and the buckets' on whole periods), its bucket takes all of
    -- it: no share to compute (a day's minutes of 2,560 series: 0.12 s instead of 0.28)
    SELECT (epoch_us(m.ts) - $origin_us) // $step_us AS k, m.series_id, m.delta, m.seconds, m.idle_seconds
    FROM /*minutes*/ m
    WHERE $whole_minutes AND m.ts >= $r0::TIMESTAMP AND m.ts < $s0::TIMESTAMP
      AND m.series_id IN (SELECT series_id FROM picked)
    UNION ALL
    SELECT (epoch_us(m.ts) - $origin_us) // $step_us AS k, m.series_id, m.delta, m.seconds, m.idle_seconds
    FROM /*minutes*/ m
    WHERE $whole_minutes AND m.ts >= $s1::TIMESTAMP AND m.ts < $r1::TIMESTAMP
      AND m.series_id IN (SELECT series_id FROM picked)
    UNION ALL
    -- six-minute rows are always whole: their pieces' edges and the steps that read them are whole
    -- six minutes (warehouse/read.py, plan)
    SELECT (epoch_us(x.ts) - $origin_us) // $step_us AS k, x.series_id, x.delta, x.seconds, x.idle_seconds
    FROM /*sixes*/ x
    WHERE x.ts >= $s0::TIMESTAMP AND x.ts < $h0::TIMESTAMP AND x.series_id IN (SELECT series_id FROM picked)
    UNION ALL
    SELECT (epoch_us(x.ts) - $origin_us) // $step_us AS k, x.series_id, x.delta, x.seconds, x.idle_seconds
    FROM /*sixes*/ x
    WHERE x.ts >= $h1::TIMESTAMP AND x.ts < $s1::TIMESTAMP AND x.series_id IN (SELECT series_id FROM picked)
    UNION ALL
    SELECT (epoch_us(h.ts) - $origin_us) // $step_us AS k, h.series_id, h.delta, h.seconds, h.idle_seconds
    FROM /*hours*/ h
    WHERE $whole_hours AND h.ts >= $h0::TIMESTAMP AND h.ts < $h1::TIMESTAMP
      AND h.series_id IN (SELECT series_id FROM picked)
),
clipped AS (
    SELECT series_id, delta, covered, idle, hi - lo AS span, greatest(lo, a) AS x, least(hi, b) AS y
    FROM src WHERE greatest(lo, a) < least(hi, b) AND hi > lo
),
buckets AS (  -- the first and last bucket each piece [x, y) reaches into
    SELECT *, (x - $origin_us) // $step_us AS first, (y - 1 - $origin_us) // $step_us AS last FROM clipped
),
split AS (
    -- a piece inside one bucket (nearly every rollup row) is its bucket's share as it is: the
    -- general case's share for k = first = last, with no list to unnest
    SELECT series_id, first AS k, delta, covered, idle, (y - x) / span AS share
    FROM buckets WHERE first = last
    UNION ALL
    SELECT series_id, k, delta, covered, idle,
           (least(y, $origin_us + (k + 1) * $step_us) - greatest(x, $origin_us + k * $step_us)) / span AS share
    FROM (SELECT *, unnest(range(first, last + 1)) AS k FROM buckets WHERE first < last)
),
pieces AS (  -- what each row gives each bucket k it reaches
    SELECT k, series_id, delta * share AS delta, covered * share AS seconds, idle * share AS idle_seconds
    FROM split
    UNION ALL
    SELECT k, series_id, delta, seconds, idle_seconds FROM whole
),
per_series AS (
    SELECT make_timestamp($origin_us + k * $step_us) AS bucket, series_id, sum(delta) AS delta,
           sum(seconds) AS seconds, sum(idle_seconds) AS idle_seconds
    FROM pieces
    GROUP BY ALL
)
