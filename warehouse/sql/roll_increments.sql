-- Raw increments with ts in [$from, $until), split by $unit_us periods (minutes):
-- each period gets the share of the interval (ts - seconds, ts] that lies in it, so a rollup row
-- holds the counter's increase over its own period of wall time and sums over periods are exact
-- (docs/definitions.md, Windows). Interval seconds and idle seconds (those of intervals in which
-- the counter did not move) split the same way; a reset counts in the period its scrape closed.
SELECT make_timestamp(k * $unit_us) AS ts, series_id, sum(delta * share) AS delta,
       sum(seconds * share) AS seconds, sum(idle * share) AS idle_seconds,
       (count(*) FILTER (WHERE reset AND k = (hi - 1) // $unit_us))::INTEGER AS resets
FROM (SELECT *, (least(hi, (k + 1) * $unit_us) - greatest(lo, k * $unit_us)) / (hi - lo) AS share
      FROM (SELECT *, unnest(range(lo // $unit_us, (hi - 1) // $unit_us + 1)) AS k
            FROM (SELECT series_id, delta, seconds, reset, CASE WHEN delta = 0 THEN seconds ELSE 0.0 END AS idle,
                         epoch_us(ts) - round(seconds * 1e6)::BIGINT AS lo, epoch_us(ts) AS hi
                  FROM increments WHERE ts >= $from::TIMESTAMP AND ts < $until::TIMESTAMP)
            WHERE hi > lo))
GROUP BY ALL
