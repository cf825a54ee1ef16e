-- A day's window is read in steps of 12 minutes, and the minute rollups served it: 1,440 rows per
-- series, about 20 M rows for the Live page's token counters, 3.7 M for one instance's per-rank
-- expert tokens. These tables hold the same counters split by six-minute periods (a period divides
-- an hour and every step from 6 minutes up to an hour, 12 minutes included; warehouse/read.py
-- rounds such steps to it): a day is 240 rows per series. The writer fills them in each minute's
-- roll, the roll's minute rows summed per six minutes, and compacts them with the hour rows when
-- an hour closes (warehouse/rollup.py); retention drops them with the minutes.
--
-- This fills them from the minute rows already there (six of them sum to their period's row), each
-- hour's rows stored series by series.
CREATE TABLE IF NOT EXISTS increments_6m (
    ts            TIMESTAMP NOT NULL,  -- period start (a multiple of 6 minutes)
    series_id     BIGINT NOT NULL,
    delta         DOUBLE NOT NULL,     -- the counter's increase over the period's wall time
    seconds       DOUBLE NOT NULL,     -- interval seconds inside the period
    resets        INTEGER NOT NULL,
    idle_seconds  DOUBLE NOT NULL      -- seconds of intervals in which the counter did not move
);
CREATE TABLE IF NOT EXISTS pool_histograms_6m (
    ts            TIMESTAMP NOT NULL,  -- period start
    role          VARCHAR NOT NULL,
    metric        VARCHAR NOT NULL,
    le            DOUBLE,
    delta         DOUBLE NOT NULL,     -- sums over the pool's series of increments_6m's columns
    seconds       DOUBLE NOT NULL,
    idle_seconds  DOUBLE NOT NULL
);

INSERT INTO increments_6m BY NAME
SELECT * FROM (
    SELECT time_bucket(INTERVAL 6 MINUTE, ts) AS ts, series_id, sum(delta) AS delta, sum(seconds) AS seconds,
           sum(resets)::INTEGER AS resets, sum(idle_seconds) AS idle_seconds
    FROM increments_1m GROUP BY 1, 2
) ORDER BY time_bucket(INTERVAL 1 HOUR, ts), series_id, ts;

INSERT INTO pool_histograms_6m BY NAME
SELECT * FROM (
    SELECT time_bucket(INTERVAL 6 MINUTE, ts) AS ts, role, metric, le, sum(delta) AS delta, sum(seconds) AS seconds,
           sum(idle_seconds) AS idle_seconds
    FROM pool_histograms_1m GROUP BY 1, 2, 3, 4
) ORDER BY time_bucket(INTERVAL 1 HOUR, ts), role, metric, le, ts;

-- the read layer serves steps of six minutes from these tables where this row is (a lake's racks
-- have none: their minutes serve them)
INSERT INTO rollup_state VALUES ('increments_6m', TIMESTAMP '1970-01-01') ON CONFLICT (name) DO NOTHING;
