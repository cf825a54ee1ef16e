-- A day's latency histograms on the Live page summed 7,000 bucket series (every engine's every
-- bucket) over 1,440 minute rows each, to give one count per pool, sample name and bucket bound.
-- These tables hold those sums as the minute and hour rollups close: one row per minute (hour),
-- pool (the target's role when the minute rolled up), sample name and bucket bound, with the
-- member series' increases, covered seconds and idle seconds summed; the read layer serves a
-- statement that asks per pool from them (warehouse/read.py, pooled statements), and the edges
-- of its window from the raw rows, so the numbers are those of the per-series rollups.
--
-- This fills them from the per-series rollups already there.
CREATE TABLE IF NOT EXISTS pool_buckets_1m (
    ts            TIMESTAMP NOT NULL,  -- minute start
    role          VARCHAR NOT NULL,    -- the pool: its targets' role
    metric        VARCHAR NOT NULL,    -- sample name, e.g. vllm:time_to_first_token_seconds_bucket
    le            DOUBLE NOT NULL,     -- bucket upper bound
    delta         DOUBLE NOT NULL,     -- sums over the pool's series of increments_1m's columns
    seconds       DOUBLE NOT NULL,
    idle_seconds  DOUBLE NOT NULL
);
CREATE TABLE IF NOT EXISTS pool_buckets_1h (
    ts            TIMESTAMP NOT NULL,  -- hour start
    role          VARCHAR NOT NULL,
    metric        VARCHAR NOT NULL,
    le            DOUBLE NOT NULL,
    delta         DOUBLE NOT NULL,     -- sums over the pool's series of increments_1h's columns
    seconds       DOUBLE NOT NULL,
    idle_seconds  DOUBLE NOT NULL
);

INSERT INTO pool_buckets_1m
SELECT x.ts, t.role, s.metric, s.le, sum(x.delta), sum(x.seconds), sum(x.idle_seconds)
FROM increments_1m x JOIN series s USING (series_id) JOIN targets t ON t.name = s.target
WHERE s.le IS NOT NULL GROUP BY ALL ORDER BY ALL;

INSERT INTO pool_buckets_1h
SELECT x.ts, t.role, s.metric, s.le, sum(x.delta), sum(x.seconds), sum(x.idle_seconds)
FROM increments_1h x JOIN series s USING (series_id) JOIN targets t ON t.name = s.target
WHERE s.le IS NOT NULL GROUP BY ALL ORDER BY ALL;

-- the read layer serves pooled statements from these tables where this row is (a lake's racks
-- have no pool tables: it reads the per-series rollups there)
INSERT INTO rollup_state VALUES ('pool_buckets', TIMESTAMP '1970-01-01') ON CONFLICT (name) DO NOTHING;
