-- Price sheets, versioned by effective time; rows are only ever added (a price in effect is not edited).
CREATE TABLE IF NOT EXISTS gpu_prices (
    effective         TIMESTAMP NOT NULL,  -- UTC; in effect until the next entry for the same pool
    pool              VARCHAR NOT NULL,    -- prefill | decode | * (every GPU)
    usd_per_gpu_hour  DOUBLE NOT NULL,
    sheet             VARCHAR NOT NULL,    -- the sheet's name
    source            VARCHAR NOT NULL,    -- where the price comes from
    loaded_at         TIMESTAMP NOT NULL,
    PRIMARY KEY (pool, effective)
);

CREATE TABLE IF NOT EXISTS token_prices (
    effective                          TIMESTAMP NOT NULL PRIMARY KEY,
    usd_per_mtok_input_cache_hit       DOUBLE NOT NULL,
    usd_per_mtok_input_cache_miss      DOUBLE NOT NULL,
    usd_per_mtok_output                DOUBLE NOT NULL,
    off_peak_utc                       VARCHAR,  -- "HH:MM-HH:MM", may wrap midnight; NULL: no off-peak
    off_peak_usd_per_mtok_input_cache_hit   DOUBLE,
    off_peak_usd_per_mtok_input_cache_miss  DOUBLE,
    off_peak_usd_per_mtok_output            DOUBLE,
    sheet                              VARCHAR NOT NULL,
    source                             VARCHAR NOT NULL,
    loaded_at                          TIMESTAMP NOT NULL
);
