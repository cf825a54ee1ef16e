-- Core tables: what was scraped, from whom, and the counter increases derived at ingest.
CREATE TABLE IF NOT EXISTS targets (
    name        VARCHAR PRIMARY KEY,  -- target name from the targets file
    url         VARCHAR NOT NULL,
    role        VARCHAR NOT NULL,     -- prefill | decode | router | gateway | gpu
    gpus        INTEGER NOT NULL,     -- GPUs the target holds (pool sizes come from here)
    stack       VARCHAR,              -- what is observed, e.g. twin:deepseek-v4.1-flash
    hostname    VARCHAR,
    first_seen  TIMESTAMP NOT NULL,
    last_seen   TIMESTAMP NOT NULL
);

CREATE TABLE IF NOT EXISTS series (
    series_id  BIGINT PRIMARY KEY,  -- 64-bit hash of (target, metric, labels)
    target     VARCHAR NOT NULL,
    metric     VARCHAR NOT NULL,    -- sample name, e.g. vllm:ttft_seconds_bucket
    family     VARCHAR NOT NULL,    -- metric family name as the parser gives it
    kind       VARCHAR NOT NULL,    -- counter | gauge | histogram | summary | info | stateset | unknown ...
    labels     VARCHAR NOT NULL,    -- JSON object of the labels except le, keys sorted
    engine     VARCHAR,             -- vLLM data-parallel rank, when labelled
    le         DOUBLE               -- histogram bucket upper bound, when a bucket
);

CREATE TABLE IF NOT EXISTS samples (
    ts         TIMESTAMP NOT NULL,  -- scrape time, UTC
    series_id  BIGINT NOT NULL,
    value      DOUBLE               -- NULL: the exporter said "no value" (DCGM blank)
);

CREATE TABLE IF NOT EXISTS increments (
    ts         TIMESTAMP NOT NULL,  -- scrape time that closed the interval, UTC
    series_id  BIGINT NOT NULL,
    delta      DOUBLE NOT NULL,     -- increase over the interval, Prometheus increase() rules
    seconds    DOUBLE NOT NULL,     -- interval length
    reset      BOOLEAN NOT NULL     -- the counter went down: a restart, delta counts from zero
);

CREATE TABLE IF NOT EXISTS scrapes (
    ts                TIMESTAMP NOT NULL,
    target            VARCHAR NOT NULL,
    up                BOOLEAN NOT NULL,
    duration_seconds  DOUBLE NOT NULL,
    samples           INTEGER NOT NULL,
    bytes             BIGINT NOT NULL,
    error             VARCHAR          -- why the scrape failed, NULL when up
);

CREATE OR REPLACE VIEW series_targets AS
    SELECT s.*, t.role, t.gpus, t.hostname FROM series s JOIN targets t ON s.target = t.name;
