-- Per-minute rollups the pages read for ranges with steps of a minute or more. They keep
-- counter increases (sums of deltas and interval seconds), never averages of counters, so
-- anything computed from them reconciles exactly with the raw increments.
CREATE TABLE IF NOT EXISTS increments_1m (
    ts         TIMESTAMP NOT NULL,  -- minute start; holds the increments whose scrape time falls in it
    series_id  BIGINT NOT NULL,
    delta      DOUBLE NOT NULL,     -- sum of the raw deltas
    seconds    DOUBLE NOT NULL,     -- sum of the raw interval seconds
    resets     INTEGER NOT NULL     -- raw intervals that were counter resets
);

CREATE TABLE IF NOT EXISTS samples_1m (
    ts         TIMESTAMP NOT NULL,  -- minute start
    series_id  BIGINT NOT NULL,
    value      DOUBLE,              -- mean of the minute's samples (gauges and untyped series only)
    max        DOUBLE,
    n          INTEGER NOT NULL     -- samples with a value
);

CREATE TABLE IF NOT EXISTS rollup_state (
    name     VARCHAR PRIMARY KEY,
    through  TIMESTAMP NOT NULL     -- everything before this minute is rolled up
);
