-- Each expert's share of its layer's tokens at each point of $target's trend: each snapshot, or
-- each hour when $hourly (windows of a day and more, and those stepped in hours, whose
-- /*expert_load*/ is the hourly table); only for the layers in $layers and the experts in $keys
-- (layer * 2^20 + expert) when they are given, so a day of snapshots is not read back for ten
-- sparklines. Hourly points take the hours the hourly table already holds whole inside the window
-- from it (as expert_share.sql), the rest (the edges, the open hour) from the snapshots summed per
-- hour: a day's trend reads a day of hourly rows, not the day's 22 M snapshot rows.
WITH hours AS (
    SELECT h0, CASE WHEN $hourly THEN greatest(h0, least(time_bucket(INTERVAL 1 HOUR, $end::TIMESTAMP), coalesce(rolled, h0)))
                    ELSE h0 END AS h1
    FROM (SELECT CASE WHEN $hourly
                      THEN least(time_bucket(INTERVAL 1 HOUR, $since::TIMESTAMP - INTERVAL 1 MICROSECOND) + INTERVAL 1 HOUR,
                                 $end::TIMESTAMP)
                      ELSE $end::TIMESTAMP END AS h0,
                 (SELECT through FROM rollup_state WHERE name = '1h') AS rolled)
),
load AS (
    SELECT ts, layer, expert, tokens FROM /*expert_load*/
    WHERE ts >= $since::TIMESTAMP AND ts < (SELECT h0 FROM hours) AND target = $target
    UNION ALL
    SELECT ts, layer, expert, tokens FROM expert_load_1h
    WHERE ts >= (SELECT h0 FROM hours) AND ts < (SELECT h1 FROM hours) AND target = $target
    UNION ALL
    SELECT ts, layer, expert, tokens FROM /*expert_load*/
    WHERE ts >= greatest($since::TIMESTAMP, (SELECT h1 FROM hours)) AND ts < $end::TIMESTAMP AND target = $target
),
points AS (
    SELECT CASE WHEN $hourly THEN time_bucket(INTERVAL 1 HOUR, ts) ELSE ts END AS ts, layer, expert, tokens
    FROM load WHERE $layers::BIGINT[] IS NULL OR list_contains($layers::BIGINT[], layer::BIGINT)
),
total AS (SELECT ts, layer, sum(tokens) AS tokens FROM points GROUP BY ALL),
mine AS (
    SELECT ts, layer, expert, sum(tokens) AS tokens FROM points
    WHERE $keys::BIGINT[] IS NULL OR list_contains($keys::BIGINT[], layer::BIGINT * 1048576 + expert)
    GROUP BY ALL
)
SELECT e.ts, e.layer, e.expert, e.tokens / nullif(t.tokens, 0) AS share
FROM mine e JOIN total t USING (ts, layer)
