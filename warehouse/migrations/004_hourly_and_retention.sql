-- Per-hour rollups (from the per-minute ones), for ranges of days; same columns and meaning.
CREATE TABLE IF NOT EXISTS increments_1h (
    ts         TIMESTAMP NOT NULL,  -- hour start
    series_id  BIGINT NOT NULL,
    delta      DOUBLE NOT NULL,
    seconds    DOUBLE NOT NULL,
    resets     INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS samples_1h (
    ts         TIMESTAMP NOT NULL,
    series_id  BIGINT NOT NULL,
    value      DOUBLE,              -- mean of the hour's samples
    max        DOUBLE,
    n          INTEGER NOT NULL
);
