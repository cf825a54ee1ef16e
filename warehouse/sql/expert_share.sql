-- Tokens per logical expert of $target in the window: per-snapshot load, or its hourly
-- downsampling for windows stepped in hours (/*expert_load*/, warehouse/read.py). The hours the
-- hourly table already holds whole inside the window are read from it (the sums of the same
-- snapshots, sixty times fewer rows), the rest from /*expert_load*/.
WITH hours AS (
    SELECT h0, greatest(h0, least(time_bucket(INTERVAL 1 HOUR, $end::TIMESTAMP), coalesce(rolled, h0))) AS h1
    FROM (SELECT time_bucket(INTERVAL 1 HOUR, $since::TIMESTAMP - INTERVAL 1 MICROSECOND) + INTERVAL 1 HOUR AS h0,
                 (SELECT through FROM rollup_state WHERE name = '1h') AS rolled)
)
SELECT layer, expert, sum(tokens) AS tokens FROM (
    SELECT layer, expert, tokens FROM /*expert_load*/
    WHERE ts >= $since::TIMESTAMP AND ts < least($end::TIMESTAMP, (SELECT h0 FROM hours)) AND target = $target
    UNION ALL
    SELECT layer, expert, tokens FROM expert_load_1h
    WHERE ts >= (SELECT h0 FROM hours) AND ts < (SELECT h1 FROM hours) AND target = $target
    UNION ALL
    SELECT layer, expert, tokens FROM /*expert_load*/
    WHERE ts >= greatest($since::TIMESTAMP, (SELECT h1 FROM hours)) AND ts < $end::TIMESTAMP AND target = $target
)
GROUP BY ALL ORDER BY layer, expert
